"""Faults lose nothing a checkpoint held: a NaN loss stops the run with the last good checkpoint
intact; a damaged checkpoint is a clear error, never a silent fresh start."""

import json
import os

import jax
import numpy as np
import pytest

from tests.rl.test_trainer import engine, workload
from tlt_jax.checkpoint import Checkpointer, CheckpointError
from tlt_jax.errors import TrainingError
from tlt_jax.rl.grpo import GRPOConfig
from tlt_jax.rl.trainer import LoopConfig, Trainer
from tlt_jax.rl.update import OptimConfig


def trainer(out_dir, steps, score=None, checkpoint_every=1):
  w = workload()
  if score is not None:
    w.score = score
  return Trainer(w, LoopConfig(str(out_dir), steps, prompts_per_step=4, group_size=4,
                               checkpoint_every=checkpoint_every),
                 engine_cfg=engine(),
                 learner=GRPOConfig(), optim=OptimConfig(lr=1e-2, warmup_steps=0, total_steps=10))


def test_nan_in_the_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
  trainer(tmp_path, 2).run(progress=False)  # steps 0-1 are fine and checkpointed
  fresh = trainer(tmp_path / "fresh", 1).updater
  saved, _, _ = Checkpointer(tmp_path / "checkpoints").restore(
      {"params": fresh.params, "opt": fresh.opt_state})
  poisoned = lambda responses, answers: [float("nan")] * len(responses)
  with pytest.raises(TrainingError, match="last good checkpoint is step 2"):
    trainer(tmp_path, 4, score=poisoned).run(progress=False)
  ck = Checkpointer(tmp_path / "checkpoints")
  assert ck.latest_step() == 2
  after, meta, _ = ck.restore(saved)
  assert meta["step"] == 2
  for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(saved)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  steps = [json.loads(l)["step"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert steps == [0, 1]  # the faulty step left no record


def test_a_corrupt_checkpoint_is_a_clear_error_not_a_fresh_start(tmp_path):
  trainer(tmp_path, 2).run(progress=False)
  step_dir = tmp_path / "checkpoints" / "2"
  for root, _, files in os.walk(step_dir / "state"):
    for f in files:
      with open(os.path.join(root, f), "wb") as fh:
        fh.write(b"garbage")
  with pytest.raises(CheckpointError, match="could not be restored"):
    trainer(tmp_path, 3).run(progress=False)
  steps = [json.loads(l)["step"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert steps == [0, 1]  # nothing was overwritten by a fresh start


def test_checkpoints_without_checkpointing_enabled_are_refused(tmp_path):
  trainer(tmp_path, 1).run(progress=False)
  with pytest.raises(TrainingError, match="checkpoint_every is 0"):
    trainer(tmp_path, 2, checkpoint_every=0).run(progress=False)
