"""The orbax wrapper: round trip, keep-K, clear errors for missing and corrupt checkpoints."""

import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from tlt_jax.checkpoint import CheckpointError, Checkpointer

TREE = {"w": jnp.arange(6.0).reshape(2, 3), "opt": {"mu": jnp.ones(3), "count": jnp.int32(7)}}


def test_round_trip_and_keep(tmp_path):
  ck = Checkpointer(str(tmp_path / "ck"), keep=2)
  for step in (1, 2, 3):
    ck.save(step, {**TREE, "w": TREE["w"] * step}, {"step": step, "note": "x"})
  ck.wait()
  assert ck.all_steps() == [2, 3]
  state, meta, step = ck.restore(TREE)
  assert step == 3 and meta == {"step": 3, "note": "x"}
  np.testing.assert_array_equal(state["w"], TREE["w"] * 3)
  assert int(state["opt"]["count"]) == 7


def test_missing_checkpoint_is_a_clear_error(tmp_path):
  with pytest.raises(CheckpointError, match="No checkpoint found"):
    Checkpointer(str(tmp_path / "empty")).restore(TREE)


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
  ck = Checkpointer(str(tmp_path / "ck"))
  ck.save(5, TREE)
  ck.wait()
  state_dir = os.path.join(str(tmp_path / "ck"), "5", "state")
  for root, _, files in os.walk(state_dir):
    for f in files:
      if not f.startswith("_"):
        with open(os.path.join(root, f), "wb") as fh:
          fh.write(b"garbage")
  shutil.rmtree(os.path.join(state_dir, "d"), ignore_errors=True)
  with pytest.raises(CheckpointError, match="could not be restored"):
    Checkpointer(str(tmp_path / "ck")).restore(TREE)


def test_mismatched_structure_is_a_clear_error(tmp_path):
  ck = Checkpointer(str(tmp_path / "ck"))
  ck.save(1, TREE)
  ck.wait()
  with pytest.raises(CheckpointError, match="different model"):
    ck.restore({"w": jnp.zeros((4, 4)), "opt": TREE["opt"]})
