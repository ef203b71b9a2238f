"""End-to-end runs (make test-slow): the demo on the real warm start, benchmark variants, GRPO
runs, resume after SIGKILL, and the notebooks executed on small runs."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.test_launchers import ROOT
from tlt_jax.rl.compare import read_metrics

from tests.test_launchers import last_json, run_module

pytestmark = pytest.mark.slow


@pytest.mark.long  # the slow suite's longest (~8 min): started first
@pytest.mark.timeout(2900)  # on a fresh clone: the drafter's warm-up, every program built cold,
# beside the other slow tests (pytest -n 2) on a 2-core machine
def test_demo_meets_the_task_properties_and_runs_tlt_against_a_baseline(tmp_path):
  """The shipped warm start at temperature 1 on the distinct held-out prompts (which hold fewer
  of the short chains than the task's own mix: 31 one-step prompts of 256, against ~108 in a
  sample with repeats): accuracy in [0.1, 0.7], a long tail of lengths (p99 >= 4 x median) and
  >= 30% of G=8 groups with mixed rewards; the baseline's GRPO steps raise
  held-out accuracy (same prompts, same key); TLT (coupled) over its first steps gives identical
  rewards; after the warm-ups no step builds an XLA program; the two pictures are saved."""
  out = last_json(run_module("experiments.demo", "--config=experiments/configs/demo.py",
                             f"--config.out_dir={tmp_path}", timeout=2800,
                             fast_compile=False))
  assert 0.1 <= out["warm_start_accuracy"] <= 0.7
  assert out["length_p99"] >= 4 * out["length_p50"]
  assert out["mixed_group_fraction"] >= 0.3
  assert out["steps"] == out["tlt_steps"] == 10 and out["rewards_identical"] is True
  assert out["heldout_after"] > out["heldout_before"] and out["heldout_gain_se"] > 0
  assert out["compile_events_in_steps"] == 0 and out["compile_s"] > 0
  assert out["accept_len"] > 1.0
  for k in ("e2e_speedup", "rollout_speedup", "amdahl_bound", "rollout_share"):
    assert out[k] > 0, k
  assert [os.path.basename(p) for p in out["pictures"]] == ["reward_curves.png",
                                                            "rollout_anatomy.png"]
  assert all(os.path.getsize(p) > 10_000 for p in out["pictures"])


def test_bench_rollout_small():
  out = last_json(run_module("experiments.bench_rollout",
                             "--config=experiments/configs/bench_rollout.py:small"))
  assert out["greedy_exact"] is True and out["layout_invariant"] is True
  assert out["pool_executables"] >= 2 and out["cold_compile_s"] > 0


def test_bench_cost_small():
  out = last_json(run_module("experiments.bench_cost",
                             "--config=experiments/configs/bench_cost.py:small"))
  assert out["bandwidth_gb_s"] > 0 and len(out["table"]) == 4
  assert all(0 < r["ms"] <= r["ms_median"] for r in out["table"])
  assert sorted(out["matmul_only_ms"]) == ["1", "2"] and min(out["matmul_only_ms"].values()) > 0
  assert sorted(out["matmul_only_separate_ms"]) == ["1", "2"]
  # :small has T = 1, 2: depth 1 at both batches, with the drafter's draft step.
  assert [(r["B"], r["depth"]) for r in out["speculation_bound"]] == [(1, 1), (2, 1)]
  assert all(r["ceiling_drafter"] < r["ceiling_free"] for r in out["speculation_bound"])
  # Draft steps of each layout, timed beside the target's step: the share is their ratio.
  assert sorted(out["drafter"]) == ["vocab_32", "vocab_32_eagle3"]
  for r in [r for rows in out["drafter"].values() for r in rows]:
    assert r["share"] > 0 and r["share"] == pytest.approx(r["ms"] / r["target_ms"], rel=0.02)
  # So is the suffix proposer's work, over its corpus, prompt and response.
  assert [(r["B"], r["history"]) for r in out["suffix"]] == [(1, 320), (2, 320)]
  for r in out["suffix"]:
    assert r["share"] > 0 and r["share"] == pytest.approx(r["ms"] / r["target_ms"], rel=0.05)


def test_bench_numerics_small():
  """Invariant against fast numerics: every cell and the update timed in both."""
  out = last_json(run_module("experiments.bench_numerics",
                             "--config=experiments/configs/bench_numerics.py:small"))
  assert [(r["B"], r["T"]) for r in out["steps"]] == [(1, 1), (1, 4), (2, 1), (2, 4)]
  assert out["steps_per_call"] == 2
  assert all(r["fast_ms"] > 0 and r["invariant_ms"] > 0 for r in out["steps"])
  assert out["update_fast_s"] > 0 and out["update_invariant_s"] > 0


def test_bench_spec_small():
  """Greedy and coupled SD equal plain decoding under the XLA flags users run (the fast suite
  checks the same at its cheaper compile level), with speculative steps in both (the bandit
  tries every arm; the cost chooser's report is tests/spec/test_cost_chooser.py's). One batch
  bucket: each arm's programs once, speculating from the first step (the claim does not depend
  on compaction, which the demo runs under these flags; alone 38 -> 22 s)."""
  out = last_json(run_module("experiments.bench_spec",
                             "--config=experiments/configs/bench_spec_tiny.py:small",
                             "--config.rollout.engine.batch_buckets=(16,)", fast_compile=False))
  assert out["greedy_exact"] is True and out["coupled_identical"] is True
  assert out["differing_rows"] == out["differing_rows_greedy"] == 0.0
  assert out["accept_len"] >= 1.0 and out["accept_len_greedy"] >= 1.0
  assert list(out["chosen_per_bucket"]) == ["16"]


def test_bench_gpu_small_writes_every_figure(tmp_path):
  """The GPU benchmark's pieces on CPU (the kernel interpreted; the table says these are not
  speed figures): one JSON per benchmark and the markdown table."""
  out = last_json(run_module("experiments.bench_gpu",
                             "--config=experiments/configs/bench_gpu.py:small",
                             f"--config.out_dir={tmp_path}"))
  assert out["platform"] == "cpu" and out["attention"] == "pallas" and set(out["shapes"]) == {
      "tiny"}
  cost = json.loads((tmp_path / "tiny_cost.json").read_text())
  assert {(r["B"], r["T"]) for r in cost["table"]} == {(1, 1), (1, 4)}
  assert set(cost["verify_over_decode"]) == {"B1_T4"} and cost["step_ms_b1"] > 0
  rollout = json.loads((tmp_path / "tiny_rollout.json").read_text())
  assert [r["rows"] for r in rollout] == [2] and rollout[0]["step_ms"] > 0
  spec = json.loads((tmp_path / "tiny_spec.json").read_text())
  assert 0.0 <= spec["differing_rows"] <= 1.0 and spec["accept_len"] >= 1.0
  table = (tmp_path / "bench_gpu.md").read_text()
  assert table.startswith("CPU: the Pallas kernel is interpreted") and "\n| tiny | " in table


def test_train_grpo_small_tlt_is_the_same_run_as_the_baseline_and_the_notebooks_run(
    tmp_path, monkeypatch):
  outs = []
  for name in ("tiny_baseline", "tiny_tlt"):
    outs.append(last_json(run_module(
        "experiments.train_grpo", f"--config=experiments/configs/{name}.py:small",
        f"--config.out_dir={tmp_path / name}")))
  assert outs[0]["steps"] == outs[1]["steps"] == 3
  assert "eval_accuracy_first" in outs[0] and "eval_accuracy_final" in outs[0]
  cmp = last_json(run_module("experiments.compare_runs", str(tmp_path / "tiny_baseline"),
                             str(tmp_path / "tiny_tlt")))
  assert cmp["reward_max_abs_diff"] == 0.0 and cmp["steps"] == 3
  assert cmp["amdahl_bound"] > 0 and cmp["e2e_speedup"] > 0

  import nbformat
  from nbclient import NotebookClient
  monkeypatch.setenv("TLT_BASELINE_RUN", str(tmp_path / "tiny_baseline"))
  monkeypatch.setenv("TLT_RUN", str(tmp_path / "tiny_tlt"))
  for name in ("reward_curves", "rollout_anatomy"):
    nb = nbformat.read(os.path.join(ROOT, "notebooks", f"{name}.ipynb"), as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": os.path.join(ROOT, "notebooks")}}).execute()
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert images, f"{name} drew no figure"


def test_a_tiny_grpo_run_in_bf16_learns_with_finite_losses(tmp_path):
  """The warm-started `tiny` policy with bf16 compute and cache over float32 masters: rewards
  are mixed, gradients non-zero exactly in the steps with a mixed-reward group (a step whose
  groups all have equal rewards has zero advantages), losses finite, and the trainer's
  log-probs stay within 0.1 nats of the rollout's (measured: 0.015, 0.010; float32: 3e-6,
  4e-6)."""
  out = tmp_path / "bf16"
  last_json(run_module(
      "experiments.train_grpo", "--config=experiments/configs/tiny_baseline.py",
      "--config.model.compute_dtype=bfloat16", "--config.rollout.engine.cache_dtype=bfloat16",
      f"--config.out_dir={out}", f"--config.cache_dir={tmp_path}", "--config.train.steps=2",
      "--config.train.eval_every=0", "--config.train.checkpoint_every=0",
      "--config.train.prompts_per_step=4", "--config.train.group_size=4",
      "--config.train.num_prompts=64",
      "--config.rollout.engine.batch_buckets=(4, 16)", "--config.rollout.engine.max_batch=16"))
  history = read_metrics(str(out))
  assert len(history) == 2 and any(m["rollout/mixed_group_fraction"] > 0 for m in history)
  for m in history:
    assert np.isfinite(m["train/loss"]) and 0 <= m["train/grad_norm"] < 1e3
    assert (m["train/grad_norm"] > 0) == (m["rollout/mixed_group_fraction"] > 0)
    assert 0 < m["train/logprob_mismatch_max"] < 0.1


@pytest.mark.timeout(1500)
def test_a_run_killed_with_sigkill_resumes_the_same_trajectory(tmp_path):
  common = ["--config=experiments/configs/tiny_baseline.py:small", "--config.train.steps=5",
            "--config.train.checkpoint_every=1", "--config.train.eval_every=0"]
  straight = tmp_path / "straight"
  last_json(run_module("experiments.train_grpo", *common, f"--config.out_dir={straight}"))
  killed = tmp_path / "killed"
  cmd = [sys.executable, "-m", "experiments.train_grpo", *common, f"--config.out_dir={killed}"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  deadline = time.time() + 600
  try:
    while not (killed / "checkpoints" / "2").is_dir():  # orbax renames a finished step in place
      assert proc.poll() is None and time.time() < deadline, "the run ended before step 2"
      time.sleep(0.2)
  finally:  # killed whether it reached step 2 or the test gave up on it
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
  assert len(read_metrics(str(killed))) < 5
  resumed = last_json(run_module("experiments.train_grpo", *common, f"--config.out_dir={killed}"))
  assert resumed["first_step"] >= 2
  a, b = read_metrics(str(straight)), read_metrics(str(killed))
  assert [m["step"] for m in b] == [0, 1, 2, 3, 4]
  for x, y in zip(a, b):
    assert x["reward"] == y["reward"] and x["rollout/length_max"] == y["rollout/length_max"]
    assert x["train/loss"] == pytest.approx(y["train/loss"], abs=1e-6)


def test_drafter_warmup_small_smollm2(tmp_path):
  """The SmolLM2 drafter recipe (unrolled, T = 0.9 labels, TV, a restricted draft vocabulary) end
  to end (a few steps): trained, cached, then judged on held-out prompts greedy and at the rollout
  temperature under both rules (`test_launchers` judges the tiny drafter on its own prompts)."""
  out = last_json(run_module("experiments.drafter_warmup",
                             "--config=experiments/configs/drafter_smollm2.py:small",
                             f"--config.cache_dir={tmp_path}"))
  assert {"top1_agreement_train", "top1_agreement_d2_train", "top1_agreement_d3_train"} <= set(out)
  assert out["accept_len_greedy_heldout"] >= 1.0 and out["accept_len_t0.9_heldout"] >= 1.0
  assert out["accept_len_t0.9_rejection_heldout"] >= 1.0 and 0 <= out["total_variation_train"] <= 1
  assert 0 <= out["tf_total_variation_heldout"] <= 1 and "tf_top1_agreement_d3_heldout" in out
