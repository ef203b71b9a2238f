"""A run directory holds one run: a launch of other settings stops before any work and changes
nothing, `train.resume=False` moves the earlier run aside, a failed launch writes nothing, every
launch that starts is recorded; and the adaptive drafter's buffer and version survive a resume."""

import json
import os

import numpy as np
import pytest

from experiments.configs import tiny_baseline, tiny_tlt
from tlt_jax.errors import ConfigError
from tlt_jax.rl import rundir
from tlt_jax.rl.config import run_config
from tlt_jax.rl.run import build_trainer, run


def _config(out_dir, **overrides):
  c = tiny_baseline.get_config("small")
  c.out_dir = str(out_dir)
  c.train.steps, c.train.eval_every = 1, 0
  c.rollout.engine.batch_buckets = (16,)  # one bucket: half the programs to build
  for key, value in overrides.items():
    *path, last = key.split("__")
    node = c
    for part in path:
      node = node[part]
    node[last] = value
  return c


def _files(directory) -> dict:
  out = {}
  for root, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, directory)] = f.read()
  return out


@pytest.mark.slow  # three runs and a refused launch
def test_a_run_directory_takes_no_other_run_and_records_each_launch(tmp_path):
  out = tmp_path / "run"
  run(run_config(_config(out)), progress=False)
  before = _files(out)
  assert "config.json" in before and "checkpoints/1/meta/metadata" in before
  other = _config(out, rl__optim__lr=1e-3, task__reward="progress",
                  model__warm_start__train__steps=10)  # another model: its warm start's recipe
  with pytest.raises(ConfigError, match=r"differ in model.warm_start.train.steps, rl.optim.lr, "
                                        r"task.reward; use a new out_dir, or "
                                        r"--config.train.resume=False"):
    run(run_config(other), progress=False)
  assert _files(out) == before  # byte for byte
  # A longer run of the same settings resumes and says what it changed; config.json stays.
  run(run_config(_config(out, train__steps=2)), progress=False)
  launches = [json.loads(x) for x in (out / "launches.jsonl").read_text().splitlines()]
  assert [(x["resumed"], x["step"]) for x in launches] == [(False, 0), (True, 1)]
  assert launches[1]["changed"] == {"train.steps": [1, 2], "rl.optim.total_steps": [1, 2]}
  assert (out / "config.json").read_bytes() == before["config.json"]
  # resume=False moves the whole run aside, where it stays as it was, and starts afresh.
  fresh = dict(rl__optim__lr=1e-3, task__reward="progress", train__resume=False)
  run(run_config(_config(out, **fresh)), progress=False)
  (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.")]
  assert _files(aside)["config.json"] == before["config.json"]
  record = json.loads((out / "config.json").read_text())
  assert rundir.settings(record["config"])["task.reward"] == "progress"
  assert [json.loads(x)["resumed"] for x in (out / "launches.jsonl").read_text().splitlines()] \
      == [False]


@pytest.mark.slow  # a run and three launches
def test_a_failed_launch_writes_nothing_into_a_run_and_leaves_no_new_folder(tmp_path):
  out = tmp_path / "run"
  run(run_config(_config(out)), progress=False)
  before = _files(out)
  bad_mesh = dict(train__mesh_shape=(3, 1, 1))  # this machine has one device
  with pytest.raises(ConfigError, match="differ in train.mesh_shape"):
    run(run_config(_config(out, **bad_mesh)), progress=False)
  with pytest.raises(ConfigError, match=r"config.train.mesh_shape=\(3, 1, 1\)"):
    run(run_config(_config(tmp_path / "new", **bad_mesh)), progress=False)  # fails building
  assert _files(out) == before and not (tmp_path / "new").exists()
  (tmp_path / "stranger").mkdir()
  (tmp_path / "stranger" / "notes.txt").write_text("mine")
  with pytest.raises(ConfigError, match="holds files but no run record"):
    run(run_config(_config(tmp_path / "stranger")), progress=False)


def test_which_settings_may_change_on_resume():
  assert rundir.may_change("train.steps") and rundir.may_change("distributed.num_processes")
  assert not rundir.may_change("train.group_size") and not rundir.may_change("model.path")
  rc = run_config(_config("runs/x"))
  names = rundir.settings(rundir.run_record(rc))
  assert {"model.name", "rollout.temperature", "rollout.engine.max_batch", "rl.grpo.aggregation",
          "rl.optim.lr", "train.group_size", "seed", "task.reward"} <= set(names)
  assert rundir.digest(rc) == rundir.digest(run_config(_config("runs/elsewhere", train__steps=9)))
  assert rundir.digest(rc) != rundir.digest(run_config(_config("runs/x", seed=8)))


def _tlt(out_dir, steps):
  c = tiny_tlt.get_config("small")
  c.out_dir, c.train.steps, c.train.eval_every = str(out_dir), steps, 0
  c.rollout.engine.batch_buckets = (16,)  # one bucket and one drafting arm: fewer programs
  c.spec.arms = (("eagle", 3, 0), ("plain", 1, 0))
  # The schedule of the straight run: 0 ("all steps") would decay a 1-step launch's learning
  # rate over 1 step, and its first update would not be the straight run's.
  c.rl.optim.total_steps = 2
  return run_config(c)


@pytest.mark.slow  # three tiny TLT runs end to end (~35 s)
@pytest.mark.long
def test_the_adaptive_drafter_s_buffer_and_version_survive_a_resume(tmp_path):
  """`tiny_tlt:small` (one device, two drafter steps per RL step) straight to step 2, and to
  step 1 then resumed: the same buffer (tokens, lengths, steps, versions; hidden states within
  float rounding), the same drafter version, step by step; `drafter/overhead` every step."""
  straight = build_trainer(_tlt(tmp_path / "straight", 2), progress=False)
  history = straight.run(progress=False)
  build_trainer(_tlt(tmp_path / "resumed", 1), progress=False).run(progress=False)
  resumed = build_trainer(_tlt(tmp_path / "resumed", 2), progress=False)
  resumed.run(progress=False)
  a, b = straight.adaptive.local_state(), resumed.adaptive.local_state()
  for k in ("tokens", "lengths", "versions", "steps", "evicted"):
    np.testing.assert_array_equal(a[k], b[k])
  np.testing.assert_allclose(a["hidden"], b["hidden"], atol=1e-5)
  assert a["lengths"].sum() > 0 and len(set(a["steps"])) == 2
  metrics = [json.loads(x) for x in (tmp_path / "resumed" / "metrics.jsonl").read_text()
             .splitlines()]
  assert [m["drafter/version"] for m in metrics] == [m["drafter/version"] for m in history]
  assert [m["drafter/budget_steps"] for m in history] == [0, 2]  # its stated budget, once ready
  assert all(0.0 <= m["drafter/overhead"] < 1.0 for m in history + metrics)
