"""Rollout engine benchmark; the last line is one JSON object.

  python -m experiments.bench_rollout --config=experiments/configs/bench_rollout.py
  python -m experiments.bench_rollout --config=experiments/configs/bench_rollout_smollm2.py
"""

import json
import os
import sys
import tempfile
import time

import jax
from ml_collections import config_flags

from experiments import launch
from experiments.benchmarks import rollout as bench
from experiments.benchmarks.cost import step_against_floor
from tlt_jax.models.pretrained import smollm2_gguf_path
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.workloads import build_workload, workload_config

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/bench_rollout.py")


def main(argv):
  del argv
  c = _CONFIG.value
  wc, ecfg, b = workload_config(c), EngineConfig.from_dict(c.rollout.engine), c.bench
  w = build_workload(wc, b.num_prompts, c.seed)
  key = jax.random.key(c.seed)
  if b.compile_probe:  # one generate in this fresh process: how long did the pool compile?
    engine = RolloutEngine(w.model, ecfg, pad_id=w.tokenizer.pad_id)
    engine.generate(w.prompts, b.group_size, w.params, key)
    print(json.dumps({"pool_compile_s": engine.pool.report()["compile_s"]}))
    return
  out = {"model": wc.name, "rows": b.num_prompts * b.group_size}
  res = bench.engine_vs_naive(w.model, w.prompts, b.group_size, w.params, ecfg, key,
                              w.tokenizer.pad_id)
  print(f"naive {res['naive_s']} s, engine {res['engine_s']} s, timeline {res['timeline']}")
  out.update({k: res[k] for k in ("compaction_speedup", "tokens_per_s", "naive_s", "engine_s",
                                  "pool_executables", "length_p50", "length_max")})
  out["greedy_exact"] = bench.greedy_exact(w.model, w.prompts, b.group_size, w.params, ecfg, key,
                                           w.tokenizer.pad_id)
  out["layout_invariant"] = res["same_tokens"] and bench.layout_invariant(
      w.model, w.prompts, b.group_size, w.params, ecfg, key, w.tokenizer.pad_id)
  pool = build_workload(wc, b.layout_pool_prompts, c.seed + 1,  # as a GRPO run's pool
                        policy=(w.model, w.tokenizer)).prompts
  fixed = bench.fixed_layout_cost(w.model, w.prompts, b.group_size, w.params, ecfg, key,
                                  max(map(len, pool)), w.tokenizer.pad_id)
  print(f"cache sized once ({fixed['cache_len_fixed']}) vs per call "
        f"({fixed['cache_len_per_call']}): {fixed['fixed_over_per_call']}x the wall time")
  out.update({f"layout_{k}": v for k, v in fixed.items()})
  if b.dispatch_sweep:
    out["engine_s_by_steps_per_dispatch"] = bench.dispatch_sweep(
        w.model, w.prompts, b.group_size, w.params, ecfg, key, b.dispatch_sweep,
        w.tokenizer.pad_id)
  with tempfile.TemporaryDirectory() as cache_dir:
    cfg_arg = next(a for a in sys.argv if a.startswith("--config="))
    cold, warm = bench.compile_seconds_in_fresh_processes("experiments.bench_rollout", cfg_arg,
                                                          cache_dir)
  out.update(cold_compile_s=cold, warm_compile_s=warm)
  if b.hf_compare:
    import torch  # the test extra's, for this comparison only
    import transformers
    path = smollm2_gguf_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()
    for rows in (1, 16):
      r = bench.engine_vs_hf(w.model, hf, w.prompts[0], rows, b.hf_new_tokens, ecfg,
                             w.tokenizer.pad_id)
      print(f"batch {rows}: engine {r['engine_s']} s vs HF {r['hf_s']} s")
      out[f"engine_vs_hf_b{rows}"] = r["ratio"]
    out.update(step_against_floor(w.model, 512))
  out["date"] = time.strftime("%Y-%m-%d")
  print(json.dumps(out))


if __name__ == "__main__":
  launch.run(main)
