"""Rollout benchmarks: the engine against a naive full-batch loop, layout checks, compile times,
and (for real checkpoints) Hugging Face `generate` on the same weights.

Every comparison is warm (each path runs once before it is timed), on the same prompts and keys,
so the same tokens are generated; compile time is reported apart.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import jax
import numpy as np

from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.rollout.plain import generate_plain


def timed(fn):
  t0 = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - t0


def engine_vs_naive(model, prompts, group_size: int, params: SamplingParams,
                    engine_cfg: EngineConfig, key, pad_id: int = 0, repeats: int = 2) -> dict:
  """Wall time of the naive loop (full batch until the longest row ends) ÷ the engine's."""
  rows = [p for p in prompts for _ in range(group_size)]
  bucket = next(b for b in engine_cfg.prefill_buckets if b >= max(map(len, prompts)))
  engine = RolloutEngine(model, engine_cfg, pad_id=pad_id)
  naive = lambda: generate_plain(model, rows, key, params, prompt_bucket=bucket, pad_id=pad_id)
  run = lambda: engine.generate(prompts, group_size, params, key)
  naive(), run()  # warm: compile both
  naive_s = min(timed(naive)[1] for _ in range(repeats))
  best = None
  for _ in range(repeats):
    res, s = timed(run)
    if best is None or s < best[1]:
      best = (res, s)
  res, engine_s = best
  ref = naive()
  return {
      "naive_s": round(naive_s, 3), "engine_s": round(engine_s, 3),
      "compaction_speedup": round(naive_s / engine_s, 3),
      "same_tokens": bool(np.array_equal(res.tokens, ref.tokens)),
      "tokens_per_s": round(float(res.lengths.sum()) / engine_s, 1),
      "length_p50": float(np.percentile(res.lengths, 50)),
      "length_max": int(res.lengths.max()),
      "timeline": res.timeline.summary(),
      "pool_executables": len(engine.pool),
  }


def fixed_layout_cost(model, prompts, group_size: int, params: SamplingParams,
                      engine_cfg: EngineConfig, key, max_prompt_len: int, pad_id: int = 0,
                      repeats: int = 3) -> dict:
  """What a cache sized once for the longest prompt a run may see (`max_prompt_len`, as the
  trainer sets it so that nothing compiles after warm-up) costs against one sized for each call's
  prompts: warm wall times of the same rollout, alternated, and their ratio (fixed / per call)."""
  engines = {name: RolloutEngine(model, dataclasses.replace(engine_cfg, max_prompt_len=m),
                                 pad_id=pad_id)
             for name, m in (("per_call", 0), ("fixed", max_prompt_len))}
  runs = {name: (lambda e=e: e.generate(prompts, group_size, params, key))
          for name, e in engines.items()}
  outs = {name: run() for name, run in runs.items()}  # warm: compile both
  best = {name: float("inf") for name in runs}
  for _ in range(repeats):
    for name, run in runs.items():
      best[name] = min(best[name], timed(run)[1])
  n = params.max_new_tokens
  longest = max(map(len, prompts))
  return {"cache_len_per_call": engines["per_call"].programs.layout(n, False, longest).cache_len,
          "cache_len_fixed": engines["fixed"].programs.layout(n, False).cache_len,
          "engine_s_per_call": round(best["per_call"], 4),
          "engine_s_fixed": round(best["fixed"], 4),
          "fixed_over_per_call": round(best["fixed"] / best["per_call"], 4),
          "same_tokens": bool(np.array_equal(outs["fixed"].tokens, outs["per_call"].tokens))}


def greedy_exact(model, prompts, group_size, params: SamplingParams, engine_cfg, key,
                 pad_id=0) -> bool:
  """Greedy engine output equals the plain full-batch decode."""
  greedy = dataclasses.replace(params, temperature=0.0, top_k=0, top_p=1.0)
  rows = [p for p in prompts for _ in range(group_size)]
  bucket = next(b for b in engine_cfg.prefill_buckets if b >= max(map(len, prompts)))
  ref = generate_plain(model, rows, key, greedy, prompt_bucket=bucket, pad_id=pad_id)
  res = RolloutEngine(model, engine_cfg, pad_id=pad_id).generate(prompts, group_size, greedy, key)
  return bool(np.array_equal(res.tokens, ref.tokens))


def layout_invariant(model, prompts, group_size, params, engine_cfg: EngineConfig, key,
                     pad_id=0) -> bool:
  """Sampled outputs identical under another bucket set and dispatch length."""
  other = dataclasses.replace(engine_cfg, batch_buckets=(engine_cfg.batch_buckets[-1],),
                              steps_per_dispatch=max(1, engine_cfg.steps_per_dispatch // 2 + 1))
  a = RolloutEngine(model, engine_cfg, pad_id=pad_id).generate(prompts, group_size, params, key)
  b = RolloutEngine(model, other, pad_id=pad_id).generate(prompts, group_size, params, key)
  return bool(np.array_equal(a.tokens, b.tokens))


def compile_seconds_in_fresh_processes(module: str, config_arg: str, cache_dir: str) -> tuple:
  """(cold, warm): the pool's compile seconds in a fresh process with an empty, then a warm,
  persistent compilation cache. `module` must print `{"pool_compile_s": ...}` last."""
  out = []
  for _ in range(2):
    proc = subprocess.run([sys.executable, "-m", module, config_arg,
                           f"--config.rollout.engine.compile_cache_dir={cache_dir}",
                           "--config.bench.compile_probe=True"],
                          capture_output=True, text=True, env=dict(os.environ))
    if proc.returncode != 0:
      raise RuntimeError(f"compile probe failed:\n{proc.stderr[-2000:]}")
    out.append(json.loads(proc.stdout.strip().splitlines()[-1])["pool_compile_s"])
  return out[0], out[1]


def engine_vs_hf(model, hf_model, prompt_ids: list[int], batch: int, new_tokens: int,
                 engine_cfg: EngineConfig, pad_id: int) -> dict:
  """Greedy tokens/s of the engine ÷ HF `generate` (torch threads = 2), same new-token count.
  torch is imported here: it is an optional dependency (the test extras), needed only by this
  comparison (`hf_compare`)."""
  import torch
  torch.set_num_threads(2)
  params = SamplingParams(temperature=0.0, max_new_tokens=new_tokens)  # no stop: full length
  engine = RolloutEngine(model, dataclasses.replace(engine_cfg, max_batch=max(
      batch, engine_cfg.max_batch)), pad_id=pad_id)
  run = lambda: engine.generate([prompt_ids], batch, params, jax.random.key(0))
  run()
  ours = min(timed(run)[1] for _ in range(2))
  x = torch.tensor([prompt_ids] * batch)

  def hf():
    with torch.no_grad():
      return hf_model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                               min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad_id)
  hf()
  theirs = min(timed(hf)[1] for _ in range(2))
  return {"engine_s": round(ours, 3), "hf_s": round(theirs, 3), "ratio": round(theirs / ours, 3)}


def dispatch_sweep(model, prompts, group_size, params, engine_cfg: EngineConfig, key, ks,
                   pad_id=0) -> dict:
  """Warm engine wall time for each number of decode steps per dispatch (host-sync cadence)."""
  out = {}
  for k in ks:
    engine = RolloutEngine(model, dataclasses.replace(engine_cfg, steps_per_dispatch=int(k)),
                           pad_id=pad_id)
    run = lambda: engine.generate(prompts, group_size, params, key)
    run()
    out[str(k)] = round(min(timed(run)[1] for _ in range(2)), 3)
  return out
