"""The GPU proof's CPU side: the offline bundle round-trips, the dry run writes every phase, the
proof and the GPU benchmark start from the shipped drafters, and `drafter.init_from` loads a
drafter whatever the run's sampling settings."""

import json
import os
import subprocess

import numpy as np
import pytest
from flax import nnx

from experiments import gpu_bundle
from experiments.benchmarks import gpu, proof
from experiments.configs import bench_gpu, bench_spec_smollm2, smollm2_tlt, tiny_tlt
from experiments.configs import gpu_proof as proof_config
from tests.test_launchers import last_json, run_module
from tlt_jax.drafter import warmup
from tlt_jax.errors import ConfigError
from tlt_jax.models.pretrained import smollm2_gguf_path
from tlt_jax.rl.compare import read_metrics
from tlt_jax.rl.config import run_config
from tlt_jax.rl.run import run_stages
from tlt_jax.workloads import drafter_key, drafter_recipe, workload_config


def test_the_bundle_s_parts_joined_in_the_manifest_s_order_give_the_gguf(tmp_path):
  gguf = smollm2_gguf_path()
  manifest = gpu_bundle.make_bundle(str(tmp_path), with_wheels=False)
  (entry,) = manifest["files"]
  assert entry["sha256"] == gpu_bundle.sha256(gguf) and entry["size"] == os.path.getsize(gguf)
  sizes = [os.path.getsize(tmp_path / p) for p in entry["parts"]]
  assert len(sizes) == 5 and max(sizes) <= gpu_bundle.PART_MIB << 20 and sum(sizes) == entry["size"]
  assert json.loads((tmp_path / gpu_bundle.MANIFEST).read_text()) == manifest
  (joined,) = gpu_bundle.join(str(tmp_path)).values()
  assert gpu_bundle.sha256(joined) == entry["sha256"]
  os.remove(joined)
  os.remove(tmp_path / entry["parts"][1])
  with pytest.raises(SystemExit, match=r"lacks SmolLM2-135M-Instruct.Q4_1.gguf.part1 "):
    gpu_bundle.join(str(tmp_path))


def test_a_part_travels_beside_the_tracked_tree_in_one_call():
  tracked = subprocess.run(["git", "-C", gpu_bundle.ROOT, "ls-files", "-z"], check=True,
                           capture_output=True).stdout.decode().split("\0")
  tree = sum(os.path.getsize(os.path.join(gpu_bundle.ROOT, f)) for f in tracked if f)
  assert tree + (gpu_bundle.PART_MIB << 20) <= gpu_bundle.CALL_MIB << 20, tree / 2**20


def test_a_part_cut_short_in_transit_is_one_line(tmp_path):
  data = np.random.default_rng(0).integers(0, 256, 5000, np.uint8).tobytes()
  (tmp_path / "f.bin").write_bytes(data)
  bundle = tmp_path / "bundle"
  entry = gpu_bundle.make_bundle(str(bundle), with_wheels=False, files=[str(tmp_path / "f.bin")],
                                 part_mib=1)["files"][0]
  assert entry["parts"] == ["f.bin.part0"]
  (bundle / "f.bin.part0").write_bytes(data[:-1])
  with pytest.raises(SystemExit, match="cut short in transit"):
    gpu_bundle.join(str(bundle))


@pytest.mark.slow  # the proof's launcher end to end: four GRPO runs, rollouts, costs (~2.5 min)
def test_the_dry_run_writes_every_phase_and_a_second_call_goes_on_where_it_stopped(tmp_path):
  out = last_json(run_module("experiments.gpu_proof", "--dry_run", f"--out_dir={tmp_path}"))
  assert out["phases"] == list(proof.PHASES) and out["failed"] == []
  read = lambda name: json.loads((tmp_path / f"{name}.json").read_text())
  costs = read("costs")
  assert costs["target_ms"]["B1_T1"] > 0 and costs["draft_ms"]
  cells = read("rollouts")["cells"]
  assert {(c["temperature"], c["rows"], c["arm"]) for c in cells} == {
      (t, 1, a) for t in (0.9, 0.0) for a in ("eagle_d2", "tree_d2_k2_n3")}
  for c in cells:  # float32 on CPU: SD is plain decoding, token for token
    assert c["equal_rows"] == 1.0 and c["accept_len"] >= 1.0
    assert c["predicted"] > 0 and c["plain_tokens_per_s"] > 0 and c["sd_tokens_per_s"] > 0
  grpo = read("grpo")
  assert grpo["rewards_identical"] and grpo["first_parting_step"] is None
  assert grpo["compile_events_baseline"] == grpo["compile_events_tlt"] == 0
  assert len(grpo["reward_tlt"]) == len(grpo["accept_len_by_step"]) == 1
  assert grpo["rollout_speedup"] > 0 and grpo["amdahl_bound"] > 0
  fixed = read("invariant")["cells"]  # CPU, float32: equal rows in either numerics
  assert [(c["rows"], c["arm"], c["differing_rows"]) for c in fixed] == [(1, "eagle_d2", 0.0)]
  replayed = read("replay")  # CPU, float32, invariant: replay is the run without it
  assert replayed["rewards_identical"] and replayed["first_parting_step"] is None
  assert replayed["steps"] == 2 and replayed["replay_fraction"][-1] > 0
  assert replayed["logprob_mismatch_max"] == 0.0
  buffers = read("command_buffers")  # each setting in its own process, none rejected on CPU
  assert [r["name"] for r in buffers["settings"]] == ["default", "none"]
  assert all(r["steps"][0]["step_ms"] > 0 for r in buffers["settings"])
  assert set(read("costs_grid")) >= {"target_ms", "draft_ms"}
  large = read("large")
  assert large["update_step_s"] > 0 and large["planned_update_gb"] > 0
  assert "| T | rows | arm |" in (tmp_path / "proof.md").read_text()
  # A call stopped by its time limit left the T = 0 cell undone: the next call runs that cell
  # alone, and every other phase is done before.
  saved = read("rollouts")
  (tmp_path / "rollouts.json").write_text(json.dumps(dict(
      saved, cells=[c for c in saved["cells"] if c["temperature"] == 0.9],
      skipped=[{"temperature": 0.0, "rows": 1}])))
  again = run_module("experiments.gpu_proof", "--dry_run", f"--out_dir={tmp_path}")
  assert again.stdout.count("done before") == len(proof.PHASES) - 1
  resumed = read("rollouts")
  assert resumed["skipped"] == [] and [(c["temperature"], c["arm"]) for c in resumed["cells"]] == [
      (c["temperature"], c["arm"]) for c in saved["cells"]]


def test_a_phase_that_fails_is_saved_with_its_error_and_the_next_phase_still_runs(tmp_path,
                                                                                  monkeypatch):
  """In a window one phase's fault (a kernel Triton does not lower, an allocation too large) must
  not cost the phases after it, nor what it saved before the fault, nor the next call's time:
  the failure is saved with its error, not run again, and shown in the tables."""
  def broken(ctx):
    ctx.save("command_buffers", {"settings": [{"name": "default", "steps": [
        {"rows": 1, "step_ms": 1.5}]}], "skipped": ["none"]})  # one setting before the fault
    raise RuntimeError("the process aborted\nits second line")

  runs = []
  monkeypatch.setitem(proof.FUNCTIONS, "command_buffers", broken)
  monkeypatch.setitem(proof.FUNCTIONS, "costs_grid", lambda ctx: runs.append(1) or {})
  c = proof_config.get_config("dry_run")
  c.out_dir = str(tmp_path)
  context = lambda: proof.Context(c, workload="loaded", drafter=None, results={})
  phases = ["command_buffers", "costs_grid"]
  ctx = context()
  assert proof.run_phases(ctx, phases) == ["command_buffers"] and runs == [1]
  saved = json.loads((tmp_path / "command_buffers.json").read_text())
  assert saved["error"] == "RuntimeError: the process aborted" and "in broken" in saved["traceback"]
  assert saved["settings"][0]["name"] == "default"  # what it saved before the fault is kept
  table = proof.markdown(ctx.results, "header")
  assert "`default` 1.5 ms at 1 rows" in table
  assert "Phase `command_buffers` failed: RuntimeError: the process aborted" in table
  again = context()
  assert proof.run_phases(again, phases) == ["command_buffers"] and runs == [1]
  assert again.results["command_buffers"]["error"] == saved["error"]
  # A fault that leaves the device unusable ends the call; the next (a fresh process) goes on.
  assert proof.device_usable()
  for name in phases:
    (tmp_path / f"{name}.json").unlink()
  monkeypatch.setattr(proof, "device_usable", lambda: False)
  assert proof.run_phases(context(), phases) == ["command_buffers"] and runs == [1]
  assert not (tmp_path / "costs_grid.json").exists()
  monkeypatch.setattr(proof, "device_usable", lambda: True)
  assert proof.run_phases(context(), phases) == ["command_buffers"] and runs == [1, 1]


def test_the_proof_reads_smollm2_from_the_bundle_s_gguf_on_a_box_without_the_package():
  c = proof_config.get_config()
  c.model_path = smollm2_gguf_path()
  wc = proof.proof_workload(c)
  assert (wc.name, wc.path) == ("smollm2", smollm2_gguf_path())
  assert "path" not in c.workload.model  # the config is left as it was


def test_without_a_gpu_the_proof_stops_at_once_with_one_line(tmp_path):
  proc = run_module("experiments.gpu_proof", f"--out_dir={tmp_path}", timeout=120)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr
  assert "--dry_run" in proc.stderr.strip().splitlines()[-1]
  assert not os.listdir(tmp_path)


def test_init_from_loads_the_shipped_drafter_whatever_the_sampling_and_seed():
  """`tiny_tlt` with another seed and temperature than the demo drafter's recipe: its key differs
  (a warm-up would train), and `drafter.init_from=demo` loads the shipped weights instead."""
  c = tiny_tlt.get_config("small")
  c.seed, c.rollout.temperature = 3, 0.6
  c.drafter = dict(init_from="demo", adaptive=c.drafter.adaptive)
  rc = run_config(c)
  assert rc.drafter.model == warmup.drafter_artifact_config(warmup.resolve_drafter("demo"))
  recipe = drafter_recipe({"model": {}, "warmup_prompts": 8})
  assert drafter_key(rc.workload, recipe, 3) not in {
      v["key"] for v in warmup.shipped_drafters().values()}
  stages = run_stages(rc, progress=False)
  shipped, _ = warmup.load_shipped_drafter(warmup.resolve_drafter("demo"), stages.policy[0])
  for a, b in zip(*(nnx.to_flat_state(nnx.state(d, nnx.Param)) for d in (stages.drafter, shipped))):
    np.testing.assert_array_equal(np.asarray(a[1].get_value()), np.asarray(b[1].get_value()))


def test_init_from_a_drafter_that_is_not_there_or_beside_a_model_is_one_line(tmp_path):
  c = tiny_tlt.get_config("small")
  c.drafter = dict(init_from=str(tmp_path))
  with pytest.raises(ConfigError, match=r"^config.drafter.init_from: .* is missing"):
    run_config(c)
  c.drafter = dict(init_from="llama-70b")
  with pytest.raises(ConfigError, match="shipped names"):
    run_config(c)
  c.drafter = dict(init_from="demo", model=dict(draft_vocab=16))
  with pytest.raises(ConfigError, match=r"^config.drafter.model.draft_vocab: 16, but .* empty"):
    run_config(c)


def test_a_recipe_config_starts_from_its_shipped_drafter_with_init_from_alone():
  """`bench_spec_smollm2`'s drafter recipe at T = 0 keys a drafter no one shipped (a warm-up
  would train it); `--config.drafter.init_from=smollm2` beside the recipe's `model`, which
  restates the shipped drafter's, loads that one instead."""
  c = bench_spec_smollm2.get_config()
  c.rollout.temperature = 0.0
  recipe = drafter_recipe(c.drafter, other_keys=("adaptive",))
  assert drafter_key(workload_config(c), recipe, c.seed) not in {
      v["key"] for v in warmup.shipped_drafters().values()}
  c.drafter.init_from = "smollm2"
  started = drafter_recipe(c.drafter, other_keys=("adaptive",))
  assert started.init_from == "smollm2"
  assert started.model == warmup.drafter_artifact_config(warmup.resolve_drafter("smollm2"))


def test_smollm2_tlt_and_bench_gpu_start_from_the_shipped_drafter_in_bf16():
  """The TLT recipe names the shipped SmolLM2 drafter, which loads in bf16 at the recipe's
  sampling settings (another seed and task than its warm-up's); so does bench_gpu's."""
  c = smollm2_tlt.get_config()
  c.model.compute_dtype = "bfloat16"
  rc = run_config(c)
  assert rc.drafter.init_from == "smollm2" and {a.proposer for a in rc.spec.arms} == {
      "eagle", "tree", "suffix", "plain"}
  assert rc.spec.chooser == "cost" and rc.adaptive.spot.budget_share == 0.05
  g = bench_gpu.get_config()
  g.smollm2_drafter = "smollm2"
  w, drafter = gpu.smollm2_pair(g)
  assert w.model.cfg.dtype == "bfloat16" and drafter.cfg.draft_vocab == 4096


@pytest.mark.slow
def test_smollm2_tlt_small_drafts_with_the_eagle_arms_and_adapts_its_drafter(tmp_path):
  """In bf16, as on a GPU: the shipped drafter arrives in bf16 and the first trained one in
  float32, whose cast to the shards' bf16 the warm-up builds (no compile in any step)."""
  out = last_json(run_module("experiments.train_grpo",
                             "--config=experiments/configs/smollm2_tlt.py:small",
                             f"--config.out_dir={tmp_path}", "--config.model.compute_dtype=bfloat16",
                             # the drafter's arms (the suffix arm's programs cost minutes here)
                             '--config.spec.arms=(("eagle", 3, 0), ("tree", 3, 2, 4), '
                             '("plain", 1, 0))',
                             # one batch bucket: each arm's programs once (compaction is not the
                             # claim; alone, 114 s against 143 s with the two of `:small`)
                             "--config.rollout.engine.batch_buckets=(4,)", fast_compile=False))
  metrics = read_metrics(str(tmp_path))
  eagle = sum(m.get("spec/steps/eagle_d3", 0) + m.get("spec/steps/tree_d3_k2_n4", 0)
              for m in metrics)
  assert eagle > 0 and out["accept_len"] > 1.0
  assert sum(m["drafter/steps"] for m in metrics) >= 1  # it trained within its budget
  published = sum(m["drafter/published"] for m in metrics)
  assert metrics[-1]["drafter/version"] == 1 + published  # version 1: the shipped drafter
  assert published >= 1 and [m["compile_events"] for m in metrics] == [0] * len(metrics)
