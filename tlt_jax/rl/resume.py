"""A run's state in its checkpoints: what a checkpoint holds (parameters, optimizer state, the KL
term's reference, the adaptive drafter and, per process, its data buffer, the prompts' noise
visits and stored responses, the digest of the run's settings), writing one, and resuming from
the latest. Everything a step draws is addressed by the step, so a resumed run continues the
trajectory of a run that was never stopped."""

from __future__ import annotations

import jax
import numpy as np
from absl import logging

from tlt_jax import distributed
from tlt_jax.errors import TrainingError


def _state(trainer, memory=None) -> dict:
  """What a checkpoint holds; `memory`: the prompt memory's arrays (or their shapes' zeros, to
  restore into), when the run keeps one."""
  updater = trainer.updater
  state = dict(updater.state())
  if trainer.adaptive is not None:  # the same on every process: saved once, over the mesh
    state["drafter"] = distributed.spanning(trainer.adaptive.state(), updater.mesh)
  if memory is not None:  # the same on every process (filled from the gathered rollout)
    state["memory"] = distributed.spanning(memory, updater.mesh)
  return state


def _buffer_dir(trainer):
  """Where this process keeps its checkpoints of the adaptive drafter's data buffer (each
  process captures its own rows): `step_<N>.npz`, numbered as the run's checkpoints."""
  return trainer.out_dir / "drafter_buffer" / f"process_{jax.process_index()}"


def save(trainer) -> None:
  """A checkpoint of `trainer` at its current step (every process writes its part, and its own
  drafter buffer)."""
  if trainer.adaptive is not None:
    directory = _buffer_dir(trainer)
    directory.mkdir(parents=True, exist_ok=True)
    part = directory / f"step_{trainer.step}.npz.tmp"
    with part.open("wb") as f:
      np.savez(f, **trainer.adaptive.local_state())
    part.rename(directory / f"step_{trainer.step}.npz")
    for old in sorted(directory.glob("step_*.npz"),
                      key=lambda p: int(p.name[5:-4]))[:-trainer.loop.keep]:
      old.unlink()
  memory = trainer.memory.state() if trainer.memory is not None else None
  trainer.ckpt.save(trainer.step, _state(trainer, memory),
                    {"step": trainer.step, "seed": trainer.seed,
                     "memory_shapes": jax.tree.map(lambda x: list(x.shape), memory),
                     "update_count": trainer.updater.step_count,
                     "drafter_version": trainer.engine.weights.drafter_version,
                     "settings_digest": trainer.settings_digest,
                     "data_iterator": {"kind": "step-addressed", "next_step": trainer.step}})


def restore(trainer) -> bool:
  """Resumes `trainer` from the latest checkpoint if its run directory has one (False: none); a
  damaged or mismatched checkpoint raises (never a silent fresh start)."""
  if trainer.ckpt is None:
    if trainer.ckpt_dir.is_dir() and any(trainer.ckpt_dir.iterdir()):
      raise TrainingError(
          f"{trainer.out_dir} holds checkpoints but checkpoint_every is 0: resuming would be "
          "skipped. Set checkpoint_every > 0 to resume, or use a new out_dir.")
    return False
  if trainer.ckpt.latest_step() is None:
    return False
  latest = trainer.ckpt.read_meta()
  if latest.get("settings_digest") and trainer.settings_digest and (
      latest["settings_digest"] != trainer.settings_digest):
    raise TrainingError(f"The checkpoint in {trainer.ckpt_dir} belongs to a run of other "
                        "settings (its settings digest differs); use a new out_dir, or "
                        "--config.train.resume=False to move that run aside.")
  shapes = latest.get("memory_shapes") if trainer.memory is not None else None
  if trainer.memory is not None and not shapes:
    raise TrainingError(f"The checkpoint in {trainer.ckpt_dir} has no prompt memory but the "
                        "config sets rollout.noise = 'prompt'; resume with the config it was "
                        "written with, or use a new out_dir.")
  memory = None if shapes is None else jax.tree.map(
      lambda shape, like: np.zeros(shape, like.dtype), shapes, trainer.memory.state(),
      is_leaf=lambda x: isinstance(x, list))
  state, meta, _ = trainer.ckpt.restore(_state(trainer, memory))
  if int(meta.get("seed", trainer.seed)) != trainer.seed:
    raise TrainingError(f"The checkpoint in {trainer.ckpt_dir} was written with seed "
                        f"{meta['seed']} but the config says {trainer.seed}; use the same seed "
                        "to resume, or a new out_dir.")
  updater = trainer.updater
  updater.load_state({k: state[k] for k in ("params", "opt", "ref_params") if k in state},
                     int(meta.get("update_count", meta["step"])))
  trainer.step = int(meta["step"])
  if trainer.memory is not None:
    trainer.memory.load_state(jax.tree.map(np.asarray, state["memory"]))
  trainer.sync_policy()
  if trainer.adaptive is not None:
    drafter = distributed.local_copy(state["drafter"], updater.mesh)
    trainer.adaptive.load_state(drafter, int(meta.get("drafter_version", 0)))
    trainer.adaptive.after_update()
    _restore_buffer(trainer, int(meta["step"]))
  return True


def _restore_buffer(trainer, step: int) -> None:
  """This process's drafter buffer as the checkpoint of `step` left it; where that checkpoint
  kept none (an older run), the buffer refills from the next rollouts, and a warning says so."""
  path = _buffer_dir(trainer) / f"step_{step}.npz"
  if not path.exists():
    logging.warning("The checkpoint of step %d holds no drafter buffer for this process; the "
                    "drafter trains on the rollouts from here on.", step)
    return
  with path.open("rb") as f:
    with np.load(f) as saved:
      trainer.adaptive.load_local_state({k: saved[k] for k in saved.files})
