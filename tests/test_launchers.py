"""Launchers end to end on their small variants, in fresh processes."""

import json
import os
import re
import subprocess
import sys

import ml_collections
import pytest
from absl import flags
from ml_collections import config_flags

from experiments import launch
from experiments.configs import hf_math, tiny_baseline, tiny_tlt
from tests.conftest import FAST_COMPILE
from tlt_jax.errors import ConfigError
from tlt_jax.rl.config import run_config
from tlt_jax.rl.pictures import run_labels
from tlt_jax.rl.run import build_trainer, run_stages

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_module(module: str, *args: str, timeout: int = 600,
               fast_compile: bool = True) -> subprocess.CompletedProcess:
  """Runs `python -m module args`; with `fast_compile=False` under XLA's default flags, as a user
  runs it (the suite's cheap LLVM level nearly halves compile time but slows long computations:
  the SFT launcher test took 181 s under it, 94 s without; docs/BENCHMARKS.md)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
  if not fast_compile:
    env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace(FAST_COMPILE, "").strip()
  return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout)


def last_json(proc: subprocess.CompletedProcess) -> dict:
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # the SFT launcher end to end, twice (~40 s)
def test_sft_launcher_small_trains_then_reuses_its_cache(tmp_path):
  args = ("--config=experiments/configs/sft_tiny.py:small", f"--config.cache_dir={tmp_path}")
  first = run_module("experiments.sft_warmstart", *args, fast_compile=False)  # training-bound
  out = last_json(first)
  assert "trained and cached" in first.stdout
  assert not re.search(r"^I\d{4} ", first.stderr, re.M)  # no library INFO logs (orbax's save)
  assert 0.0 <= out["accuracy"] <= 1.0 and out["sft_steps"] == 20
  assert out["sft_loss"] < 0.9 * out["sft_loss_first"]  # the small recipe still trains (3.2 -> 2.8)
  assert out["length_p99"] >= out["length_p50"] >= 1
  second = run_module("experiments.sft_warmstart", *args, fast_compile=False)
  assert "loaded from" in second.stdout
  assert last_json(second)["accuracy"] == out["accuracy"]  # same weights, same keys


@pytest.mark.slow
def test_the_drafter_warmup_trains_once_then_judges_on_held_out_or_its_own_prompts(tmp_path):
  """`experiments.drafter_warmup` on `drafter_tiny.py:small`: trained and cached, judged on
  held-out prompts; then, from the cache, on its warm-up prompts (`--eval_side=train`) and
  teacher-forced on the very sequences it trained on. (`test_end_to_end` runs the SmolLM2 recipe.)"""
  args = ("experiments.drafter_warmup", "--config=experiments/configs/drafter_tiny.py:small",
          f"--config.cache_dir={tmp_path}")
  first = run_module(*args)
  held = last_json(first)
  assert "drafter trained and cached" in first.stdout
  for rule in ("greedy", "t1", "t1_rejection"):
    assert held[f"accept_len_{rule}_heldout"] >= 1.0
  assert 0 <= held["tf_total_variation_heldout"] <= 1
  second = run_module(*args, "--eval_side=train")
  train = last_json(second)
  assert "drafter loaded from the cache" in second.stdout and train["cache"] == held["cache"]
  assert train["accept_len_greedy_train_prompts"] >= 1.0 and "accept_len_greedy_heldout" not in train
  assert 0 <= train["tf_total_variation_trained"] <= 1 and "tf_top1_agreement_trained" in train


def test_bad_config_value_is_a_clear_error_before_work(tmp_path):
  proc = run_module("experiments.sft_warmstart", "--config=experiments/configs/sft_tiny.py:small",
                    f"--config.cache_dir={tmp_path}", "--config.train.lr=-1.0")
  assert proc.returncode != 0
  assert "config.train.lr must be > 0" in proc.stderr
  assert not os.listdir(tmp_path)


def test_a_bad_command_line_is_one_line_naming_the_key_and_the_nearest_known_one(monkeypatch):
  """A launcher process for the wiring; then the launcher's flag parsing in-process, over its
  own flags, for a value that does not parse and a variant the config file lacks."""
  proc = run_module("experiments.sft_warmstart", "--config=experiments/configs/sft_tiny.py:small",
                    "--config.train.lrr=1")
  assert proc.returncode != 0 and "Traceback" not in proc.stderr
  assert ("config.train has no key 'lrr'; did you mean config.train.lr?"
          in proc.stderr.strip().splitlines()[-1])
  for config, override, expect in (
      ("sft_tiny.py:small", "--config.train.lr=abc", "--config.train.lr=abc: could not convert"),
      ("sft_tiny.py:smal", None, "Unknown variant 'smal'"),
      ("sft_tiny.py:smal", "--config.train.lr=1", "Unknown variant 'smal'"),
      ("sft_tny.py:small", None, "no config file 'experiments/configs/sft_tny.py'")):
    own = flags.FlagValues()
    config_flags.DEFINE_config_file("config", "experiments/configs/sft_tiny.py", flag_values=own)
    argv = ["sft_warmstart", f"--config=experiments/configs/{config}", *filter(None, [override])]
    monkeypatch.setattr(sys, "argv", list(argv))  # ml_collections reads overrides from there
    with pytest.raises(SystemExit) as e:
      launch.parse_flags(argv, own)
    assert expect in str(e.value) and "\n" not in str(e.value)


def test_a_launcher_s_usage_error_is_one_line_without_the_flags_help(tmp_path):
  """absl prints every flag's help above a `UsageError`; our launchers print its line alone."""
  proc = run_module("experiments.compare_runs", str(tmp_path / "a"), str(tmp_path / "b"))
  assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines() == [
      f"No metrics.jsonl in {str(tmp_path / 'a')!r}: is it a train_grpo run directory?"]


def test_a_bad_run_setting_is_one_line_before_any_work(tmp_path):
  """Checked before the warm start loads: a bad value, an unknown learner or workload. One
  launcher process shows the wiring (one line, no traceback, no run directory); the other
  settings are checked in-process, where `run_config` raises what that line prints."""
  proc = run_module("experiments.train_grpo", "--config=experiments/configs/tiny_baseline.py:small",
                    f"--config.out_dir={tmp_path}/run", "--config.rollout.temperature=-1.0")
  assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert "config.rollout: temperature must be >= 0" in proc.stderr.strip().splitlines()[-1]
  for arg, expect in (
      ("--config.rl.learner=gpso", "config.rl.learner='gpso' is not a learner; available: dapo, "
                                   "grpo, gspo"),
      ("--config.model.name=tinny", "(did you mean 'tiny'?)"),
      ("--config.rl.optim.lr=0.0", "config.rl.optim: lr must be > 0")):
    c = tiny_baseline.get_config("small")
    c.out_dir = str(tmp_path / "run")
    launch.set_field(c, arg)
    with pytest.raises(ConfigError) as e:
      run_config(c, other_keys=("sweep",))
    assert expect in str(e.value) and "\n" not in str(e.value)
  assert "config.train has no key 'mini_batchs'; did you mean config.train.mini_batches?" in (
      launch.unknown_key(c, "--config.train.mini_batchs=2", "f"))
  assert not os.path.exists(tmp_path / "run")


def test_an_override_of_a_schema_field_is_checked_and_typed():
  """What the launcher does with `--config.a.b=v` for a key the file lacks (in-process: the
  subprocess tests above cover the wiring): a schema field is accepted and parsed by its type,
  in a section the file lacks too; a misspelling names the nearest key; a bad value its type."""
  c = tiny_baseline.get_config("small")
  assert launch.unknown_key(c, "--config.train.mini_batches=2", "f") == ""
  assert launch.unknown_key(c, "--config.rl.dapo.max_rounds=1", "f") == ""
  assert "did you mean config.rl.dapo.max_rounds?" in launch.unknown_key(
      c, "--config.rl.dapo.max_roundz=1", "f")
  launch.set_field(c, "--config.rl.dapo.max_rounds=3")
  launch.set_field(c, "--config.train.mesh_shape=(1, 1, 1)")
  assert c.rl.dapo.max_rounds == 3 and c.train.mesh_shape == (1, 1, 1)
  assert isinstance(c.rl.dapo, ml_collections.ConfigDict)
  with pytest.raises(SystemExit, match="'two' is not of type int"):
    launch.set_field(c, "--config.train.mini_batches=two")


def test_a_launcher_leaves_the_config_overrides_after_dashes_to_its_command():
  """`launch_local -- CMD --config.x=v`: the overrides are CMD's, not the launcher's."""
  proc = run_module("experiments.launch_local", "--num_processes=1", "--", sys.executable, "-c",
                    "import sys; print('child got', sys.argv[1:])", "--config.train.steps=2")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "child got ['--config.train.steps=2']" in proc.stdout


@pytest.mark.slow
def test_the_command_line_sets_fields_the_config_file_does_not_mention(tmp_path):
  """One home per default: any field of a section's dataclass (tlt_jax/rl/schema.py) may be set
  from the command line, also in a section no file holds (`rl.dapo`): a DAPO run with two
  mini-batches and two epochs per rollout from the GRPO baseline's small config."""
  out = last_json(run_module(
      "experiments.train_grpo", "--config=experiments/configs/tiny_baseline.py:small",
      f"--config.out_dir={tmp_path}/run", "--config.rl.learner=dapo",
      "--config.rl.dapo.max_rounds=1", "--config.train.mini_batches=2",
      "--config.train.update_epochs=2", "--config.train.steps=1", "--config.train.eval_every=0"))
  assert out["steps"] == 1
  metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
  assert metrics["train/optimizer_steps"] == 4 and metrics["train/top_up_rounds"] <= 1
  assert metrics["compile_events"] == 0


def test_a_layout_the_devices_cannot_hold_is_one_line(tmp_path):
  """Checked when the trainer is built, before its warm-up, against the devices this process
  has (one here); in-process, where `build_trainer` raises the `ConfigError` a launcher prints as
  its last line (the launcher's wiring: the test above)."""
  stages = None
  for arg, expect in (("--config.train.mesh_shape=(2, 1)",
                       "config.train.mesh_shape=(2, 1) on 1 process(es) x 1 device(s): A mesh of "
                       "data=2 x fsdp=1 x tp=1 needs 2 devices but 1 are visible (1 process(es))"),
                      ("--config.rollout.engine.num_shards=2",
                       "config.rollout.engine: num_shards=2 x 1 device(s) per shard needs 2 "
                       "devices but 1 are visible"),
                      ("--config.train.micro_batches=3",
                       "64 rows do not split into 1 mini-batch(es) of 3 micro-batch(es) over the "
                       "update's 1 devices")):
    c = tiny_tlt.get_config("scale")
    c.out_dir = str(tmp_path / "run")
    launch.set_field(c, arg)
    rc = run_config(c, other_keys=("sweep",))
    stages = stages or run_stages(rc, progress=False)
    with pytest.raises(ConfigError) as e:
      build_trainer(rc, progress=False, stages=stages)
    assert expect in str(e.value) and "\n" not in str(e.value)


def test_the_gpu_benchmark_stops_at_once_without_a_gpu(tmp_path):
  """`python -m experiments.bench_gpu` and `make bench-gpu` on this CPU machine: one line saying
  why, before any work (make installs nothing)."""
  proc = run_module("experiments.bench_gpu", f"--config.out_dir={tmp_path}/gpu", timeout=120)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert "experiments.bench_gpu needs a GPU, and jax" in proc.stderr.strip().splitlines()[-1]
  assert not os.path.exists(tmp_path / "gpu")
  env = {k: v for k, v in os.environ.items() if k != "MAKEFLAGS"}
  make = subprocess.run(["make", "-s", "bench-gpu", "VENV=" + str(tmp_path / "venv")], cwd=ROOT,
                        capture_output=True, text=True, timeout=60, env=env)
  assert make.returncode != 0 and "make bench-gpu needs an NVIDIA GPU" in make.stdout
  assert not os.path.exists(tmp_path / "venv")


def test_the_slurm_template_is_bash_and_its_example_command_is_a_valid_run():
  """`experiments/slurm/train.sbatch`: valid bash, and the command its header shows names a
  recipe and only keys a run has (the recipe's settings pass `run_config`)."""
  path = os.path.join(ROOT, "experiments", "slurm", "train.sbatch")
  assert subprocess.run(["bash", "-n", path], capture_output=True).returncode == 0
  text = open(path).read()
  assert "srun --kill-on-bad-exit=1 .venv/bin/python -m experiments.train_grpo \"$@\"" in text
  example = re.search(r"#   sbatch (.*?)\n#\n", text, re.S).group(1)
  args = [a for a in example.replace("\\\n#", " ").split() if a.startswith("--config")]
  config_path, variant = args[0].split("=", 1)[1].split(":")
  assert config_path == "experiments/configs/hf_math.py"
  c = hf_math.get_config(variant)
  run_config(c)
  for arg in args[1:]:
    assert launch.has_path(c, launch.override_path(arg)) or not launch.unknown_key(
        c, arg, config_path), arg


@pytest.mark.slow
def test_a_sweep_from_the_command_line_and_from_a_config_then_its_pictures(tmp_path):
  """Two points from `--grid`, two from a config's `sweep` of (dotted field, values) pairs; a
  field no section has is one line before any point runs; `experiments.plot` draws the points'
  curves, each labelled by its directory (their run names are the same)."""
  quick = ("--config.train.steps=1", "--config.train.eval_every=0")
  out = last_json(run_module("experiments.sweep",
                             "--config=experiments/configs/tiny_baseline.py:small",
                             '--grid={"rl.optim.lr": [1e-4, 2e-4]}',
                             f"--config.out_dir={tmp_path}/cli", *quick))
  assert [p["point"] for p in out["points"]] == [{"rl.optim.lr": 1e-4}, {"rl.optim.lr": 2e-4}]
  runs = [p["run_dir"] for p in out["points"]]
  config = tmp_path / "swept.py"
  config.write_text("from experiments.configs import tiny_baseline\n\n\ndef get_config():\n"
                    "  c = tiny_baseline.get_config('small')\n"
                    "  c.sweep = (('rl.grpo.aggregation', ('token', 'sequence')),)\n"
                    "  return c\n")
  out = last_json(run_module("experiments.sweep", f"--config={config}",
                             f"--config.out_dir={tmp_path}/file", *quick))
  assert [p["point"]["rl.grpo.aggregation"] for p in out["points"]] == ["token", "sequence"]
  bad = run_module("experiments.sweep", "--config=experiments/configs/tiny_baseline.py:small",
                   '--grid={"rl.optim.lrr": [1]}', f"--config.out_dir={tmp_path}/bad")
  assert bad.returncode != 0 and "Traceback" not in bad.stderr
  assert "did you mean config.rl.optim.lr?" in bad.stderr.strip().splitlines()[-1]
  assert not os.path.exists(tmp_path / "bad")
  assert run_labels(runs) == [os.path.basename(r) for r in runs]  # both named tiny_baseline
  plots = last_json(run_module("experiments.plot", *runs))["plots"]
  assert sorted(os.path.basename(p) for p in plots) == ["response_length.png", "reward.png"]
  assert all(p.startswith(os.path.join(runs[0], "plots")) and os.path.getsize(p) > 0
             for p in plots)
