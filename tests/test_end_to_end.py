"""End-to-end runs (make test-slow): the demo on the real warm start, benchmark variants."""

import pytest

from tests.test_launchers import last_json, run_module

pytestmark = pytest.mark.slow


@pytest.mark.timeout(1800)  # trains the warm start from scratch on a fresh clone (~7 min)
def test_demo_meets_the_task_properties():
  """The warm-started policy at temperature 1: accuracy in [0.2, 0.7], a long tail of lengths
  (p99 >= 5 x median) and >= 30% of G=8 groups with mixed rewards."""
  out = last_json(run_module("experiments.demo", "--config=experiments/configs/demo.py",
                             timeout=1500))
  assert 0.2 <= out["warm_start_accuracy"] <= 0.7
  assert out["length_p99"] >= 5 * out["length_p50"]
  assert out["mixed_group_fraction"] >= 0.3


def test_bench_rollout_small(tmp_path):
  out = last_json(run_module("experiments.bench_rollout",
                             "--config=experiments/configs/bench_rollout.py:small",
                             f"--config.sft.cache_dir={tmp_path}"))
  assert out["greedy_exact"] is True and out["layout_invariant"] is True
  assert out["pool_executables"] >= 2 and out["cold_compile_s"] > 0


def test_bench_cost_small():
  out = last_json(run_module("experiments.bench_cost", "--config=experiments/configs/bench_cost.py:small"))
  assert out["bandwidth_gb_s"] > 0 and len(out["table"]) == 4


def test_bench_spec_small(tmp_path):
  out = last_json(run_module("experiments.bench_spec",
                             "--config=experiments/configs/bench_spec_tiny.py:small",
                             f"--config.sft.cache_dir={tmp_path}"))
  assert out["greedy_exact"] is True and out["coupled_identical"] is True
  assert out["accept_len"] >= 1.0


def test_train_grpo_small_tlt_is_the_same_run_as_the_baseline(tmp_path):
  outs = []
  for name in ("tiny_baseline", "tiny_tlt"):
    outs.append(last_json(run_module(
        "experiments.train_grpo", f"--config=experiments/configs/{name}.py:small",
        f"--config.out_dir={tmp_path / name}", f"--config.sft.cache_dir={tmp_path}",
        f"--config.cache_dir={tmp_path}")))
  assert outs[0]["steps"] == outs[1]["steps"] == 2
  assert outs[0]["reward_first"] == outs[1]["reward_first"]
  assert outs[0]["reward_last"] == outs[1]["reward_last"]
