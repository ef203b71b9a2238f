"""The pieces of `experiments.bench_gpu`, each on one model: c(B, T) and the batch-1 step against
the weight-read floor, the engine's decode step inside a rollout, and speculative decoding with a
draft model against plain decoding; and the markdown table of their figures."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from experiments.benchmarks import spec as spec_bench
from experiments.benchmarks.cost import cost_table, param_bytes, step_against_floor
from tlt_jax.drafter.model import init_drafter
from tlt_jax.models.config import ModelConfig, get_shape
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.models.transformer import init_model
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.spec.strategy import SpecConfig, Strategy
from tlt_jax.workloads import build_drafter, build_workload, drafter_recipe, workload_config

GREEDY = dict(temperature=0.0, stop_tokens=())  # no stop token: every row runs its full length


def shape_model(shape, dtype: str, max_seq_len: int):
  """A random-initialised model of `shape` (a `SHAPES` name or ModelConfig fields), weights and
  compute in `dtype`."""
  cfg = get_shape(shape) if isinstance(shape, str) else ModelConfig(**shape)
  return init_model(cfg.replace(max_seq_len=max_seq_len, dtype=dtype, param_dtype=dtype), seed=0)


def cost(model, batches, tokens, cache_len: int, iters: int, rounds: int, impl: str) -> dict:
  """c(B, T) with `impl` attention, each batch's verify of T tokens over its decode step, and the
  batch-1 step against the weight-read floor (bytes of weights ÷ measured read bandwidth)."""
  table = cost_table(model, batches, tokens, cache_len, iters, rounds, impl=impl)
  c1 = {r["B"]: r["ms"] for r in table if r["T"] == 1}
  verify_x = {f"B{r['B']}_T{r['T']}": round(r["ms"] / c1[r["B"]], 3) for r in table if r["T"] > 1}
  floor = step_against_floor(model, cache_len, rounds=rounds, iters=iters, impl=impl)
  ratio = floor["step_ms_b1"] / floor["floor_ms_b1"] if floor["floor_ms_b1"] else None
  return {"weight_bytes": param_bytes(model), "table": table, "verify_over_decode": verify_x,
          **floor, "step_over_floor_b1": ratio and round(ratio, 3)}


def _prompts(model, rows: int, prompt_len: int, seed: int = 0) -> list[list[int]]:
  rng = np.random.default_rng(seed)
  return rng.integers(1, model.cfg.vocab_size, size=(rows, prompt_len)).tolist()


def _engine_cfg(rows: int, prompt_len: int, impl: str) -> EngineConfig:
  buckets = tuple(b for b in (1, 2, 4, 8, 16, 32, 64) if b < rows) + (rows,)
  return EngineConfig(batch_buckets=buckets, max_batch=rows, prefill_buckets=(prompt_len,),
                      attention=impl, precompile=False)


def rollout(model, rows: int, prompt_len: int, new_tokens: int, impl: str, repeats: int = 3
            ) -> dict:
  """The engine's greedy rollout of `rows` random prompts, warm: its decode step (decode seconds
  per step, every row running `new_tokens` steps) and tokens per second; best of `repeats`."""
  engine = RolloutEngine(model, _engine_cfg(rows, prompt_len, impl))
  params = SamplingParams(max_new_tokens=new_tokens, **GREEDY)
  prompts, key = _prompts(model, rows, prompt_len), jax.random.key(0)
  engine.generate(prompts, 1, params, key)  # warm: compile
  best = None
  for _ in range(repeats):
    res = engine.generate(prompts, 1, params, key)
    decode_s = sum(e.end - e.start for e in res.timeline.events if e.kind == "decode")
    if best is None or decode_s < best[0]:
      best = (decode_s, res)
  decode_s, res = best
  return {"rows": rows, "new_tokens": new_tokens, "step_ms": round(1e3 * decode_s / new_tokens, 3),
          "tokens_per_s": round(float(res.lengths.sum()) / decode_s, 1)}


def speculation(model, rows: int, prompt_len: int, new_tokens: int, depth: int, impl: str,
                repeats: int) -> dict:
  """SD with an EAGLE chain of `depth` against plain decoding, greedy, on `rows` random prompts.
  The draft model is random too, so its drafts are rarely accepted: the figures price a
  speculative step (draft steps and a verify), and check that greedy SD gives plain decoding's
  tokens on this backend (`differing_rows`: in bf16 a near-tie may round the other way)."""
  spec = SpecConfig(threshold=rows, arms=(Strategy("eagle", depth=depth),), min_accept_len=0.0,
                    epsilon=0.0)
  params = SamplingParams(max_new_tokens=new_tokens, **GREEDY)
  out = spec_bench.compare(model, _prompts(model, rows, prompt_len, seed=1), 1, params,
                           _engine_cfg(rows, prompt_len, impl), spec, jax.random.key(0),
                           repeats=repeats, drafter=init_drafter(model.cfg, seed=0))
  return {k: out[k] for k in ("identical", "differing_rows", "accept_len", "plain_s", "sd_s",
                              "sd_phase_speedup")}


def acceptance(model, drafter, prompts, group_size: int, params: SamplingParams, impl: str,
               depth: int, repeats: int) -> dict:
  """SD acceptance (and speed) of a trained drafter on real prompts, sampled under `coupled`."""
  rows = len(prompts) * group_size
  spec = SpecConfig(threshold=rows, arms=(Strategy("eagle", depth=depth),), min_accept_len=0.0,
                    epsilon=0.0)
  cfg = dataclasses.replace(_engine_cfg(rows, max(map(len, prompts)), impl),
                            prefill_buckets=(64, 128, 256))
  out = spec_bench.compare(model, prompts, group_size, params, cfg, spec, jax.random.key(0),
                           repeats=repeats, drafter=drafter)
  return {k: out[k] for k in ("identical", "differing_rows", "accept_len", "rollout_speedup",
                              "sd_phase_speedup")}


def smollm2_pair(c):
  """SmolLM2's word-problem workload (`c.smollm2`) and the drafter `c.smollm2_drafter` (a
  shipped drafter's name or an artifact directory), loaded in the workload's precision."""
  wc = workload_config(c.smollm2)
  w = build_workload(wc, c.smollm2.num_prompts, c.smollm2.seed)
  drafter, _ = build_drafter(wc, drafter_recipe({"init_from": c.smollm2_drafter}),
                             c.smollm2.seed, progress=False, policy=(w.model, w.tokenizer))
  return w, drafter


def markdown(results: dict, device: str, dtype: str, impl: str) -> str:
  """One table row per shape, ready for docs/BENCHMARKS.md."""
  lines = [f"Device: {device}; {dtype}, attention `{impl}`.", "",
           "| shape | weights MB | c(1,1) ms | floor ms | step/floor | c(B,4)/c(B,1) by B |"
           " engine step ms (rows) | greedy SD = plain | SD step (random drafter) s/s |",
           "|---|---|---|---|---|---|---|---|---|"]
  for name, r in results.items():
    c = r["cost"]
    verify = ", ".join(f"{k.split('_')[0][1:]}: {v}" for k, v in c["verify_over_decode"].items()
                       if k.endswith("_T4"))
    steps = ", ".join(f"{x['step_ms']} ({x['rows']})" for x in r["rollout"])
    s = r["spec"]
    lines.append(f"| {name} | {c['weight_bytes'] / 1e6:.1f} | {c['step_ms_b1']} | "
                 f"{c['floor_ms_b1']} | {c['step_over_floor_b1']} | {verify} | {steps} | "
                 f"{s['identical']} (differing {s['differing_rows']:.3f}) | "
                 f"{s['sd_s']} / {s['plain_s']} |")
  return "\n".join(lines) + "\n"
