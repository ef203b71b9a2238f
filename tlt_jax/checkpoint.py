"""The one orbax wrapper: save, restore and find the latest step of a pytree plus JSON metadata.

Used by SFT, the drafter and RL. A checkpoint directory holds numbered steps; each step holds a
`state` pytree (arrays) and a `meta` JSON dict. Restoring a missing directory or a damaged step is
a `CheckpointError` naming the path and what to do, never a silent fresh start.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from tlt_jax.paths import as_path


class CheckpointError(RuntimeError):
  """A checkpoint is missing, incomplete or does not match the expected structure."""


class Checkpointer:
  """Numbered checkpoints in `directory`, keeping the newest `keep` (None keeps all).

  With several processes a checkpoint is written and read by all of them together (each its
  part of the arrays that span them); a `local` one (a cached stage: the warm start, the warm-up
  drafter) belongs to the calling process alone and involves no other."""

  def __init__(self, directory: str, keep: int | None = 3, async_save: bool = False,
               local: bool = False):
    self.directory = as_path(directory)
    me, self._alone = jax.process_index(), local and jax.process_count() > 1
    processes = ocp.options.MultiprocessingOptions()
    if self._alone:  # orbax creates a root only for the whole group: make it here
      self.directory.mkdir(parents=True, exist_ok=True)
      processes = ocp.options.MultiprocessingOptions(
          primary_host=me, active_processes={me}, barrier_sync_key_prefix=f"local{me}")
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=not self._alone,
                                           enable_async_checkpointing=async_save,
                                           multiprocessing_options=processes)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_names=("state", "meta"))

  def latest_step(self) -> int | None:
    """The newest saved step, or None when the directory holds none."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """Every saved step, oldest first."""
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, meta: dict | None = None) -> None:
    """Saves `state` (a pytree of arrays) and `meta` (JSON-able) as `step`."""
    if self._alone:  # orbax takes a device array in a multi-process group only as global
      state = jax.tree.map(np.asarray, state)
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta or {})))

  def wait(self) -> None:
    """Blocks until the writes in flight are on disk."""
    self._manager.wait_until_finished()

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict, int]:
    """Restores `(state, meta, step)`; `abstract_state` gives the structure, shapes, shardings."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(
          f"No checkpoint found in {self.directory}. Check the path, or start a fresh run with a "
          "new output directory.")
    if step not in self.all_steps():
      raise CheckpointError(f"Checkpoint step {step} not in {self.directory} "
                            f"(available: {self.all_steps()}).")
    here = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree.map(  # a leaf with no sharding lands on this process's first device
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)
                                       or here), abstract_state)
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
    except Exception as e:  # orbax raises many types for damaged or mismatched files
      raise CheckpointError(
          f"Checkpoint step {step} in {self.directory} could not be restored ({type(e).__name__}: "
          f"{str(e)[:400]}). It is corrupt or was written for a different model/config; delete "
          "that step directory to fall back to an earlier one, or fix the config.") from e
    return restored["state"], dict(restored["meta"] or {}), step

  def read_meta(self, step: int | None = None) -> dict:
    """The JSON metadata of a step (latest by default), without reading its arrays."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"No checkpoint found in {self.directory}.")
    restored = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return dict(restored["meta"] or {})

  def close(self) -> None:
    """Waits for the writes in flight and releases the manager."""
    self._manager.close()
