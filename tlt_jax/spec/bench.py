"""Speculative-decoding benchmark: the engine with SD against the same engine without it (the
plain engine's best mode: same buckets, compaction and steps per dispatch), warm, same prompts and
keys. Speed is a ratio of wall times measured in one process."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.rollout.sampling import SamplingParams
from tlt_jax.spec.strategy import SpecConfig


def _phase_s(timeline, threshold: int) -> float:
  """Decode wall time spent while the live batch was <= threshold (the SD phase)."""
  return sum(e.end - e.start for e in timeline.events
             if (e.kind == "decode" or e.kind.startswith("spec")) and e.live <= threshold)


def _per_bucket(timeline, threshold: int) -> dict:
  out = {}
  for e in timeline.events:
    if (e.kind == "decode" or e.kind.startswith("spec")) and e.live <= threshold:
      s, t = out.get(e.bucket, (0.0, 0))
      out[e.bucket] = (s + e.end - e.start, t + e.tokens)
  return out


def _best_of(engine, prompts, g, params, key, repeats):
  engine.generate(prompts, g, params, key)  # warm: compile every reachable executable, all arms
  engine.pool.wait()
  engine.generate(prompts, g, params, key)  # first executions of late-compiled arms
  best = None
  for _ in range(repeats):
    t0 = time.perf_counter()
    res = engine.generate(prompts, g, params, key)
    wall = time.perf_counter() - t0
    if best is None or wall < best[1]:
      best = (res, wall)
  return best


def compare(model, prompts, g, params: SamplingParams, engine_cfg: EngineConfig,
            spec: SpecConfig, key, pad_id=0, repeats=2, drafter=None) -> dict:
  engine_cfg = dataclasses.replace(engine_cfg, precompile=True)
  plain_engine = RolloutEngine(model, engine_cfg, pad_id=pad_id)
  sd_engine = RolloutEngine(model, engine_cfg, pad_id=pad_id, spec=spec, drafter=drafter)
  plain, plain_s = _best_of(plain_engine, prompts, g, params, key, repeats)
  sd_engine.spec.reset_stats()
  sd, sd_s = _best_of(sd_engine, prompts, g, params, key, repeats)
  pb_plain, pb_sd = _per_bucket(plain.timeline, spec.threshold), _per_bucket(sd.timeline,
                                                                              spec.threshold)
  table = {str(b): {"plain_s": round(pb_plain[b][0], 4), "sd_s": round(pb_sd[b][0], 4),
                    "speedup": round(pb_plain[b][0] / pb_sd[b][0], 3) if pb_sd[b][0] else None}
           for b in sorted(set(pb_plain) & set(pb_sd))}
  summary = sd_engine.spec.summary()
  return {
      "identical": bool(np.array_equal(plain.tokens, sd.tokens)),
      "rollout_speedup": round(plain_s / sd_s, 3),
      "sd_phase_speedup": round(_phase_s(plain.timeline, spec.threshold)
                                / max(_phase_s(sd.timeline, spec.threshold), 1e-9), 3),
      "accept_len": summary["accept_len"],
      "chosen_per_bucket": summary["chosen_per_bucket"],
      "accept_len_per_arm": summary["accept_len_per_arm"],
      "retired": summary["retired"],
      "plain_s": round(plain_s, 3), "sd_s": round(sd_s, 3),
      "sd_on_fraction": sd.timeline.summary()["sd_on_fraction"],
      "per_bucket": table,
      "length_p50": float(np.percentile(sd.lengths, 50)), "length_max": int(sd.lengths.max()),
  }


def _decode_s(timeline) -> float:
  return sum(e.end - e.start for e in timeline.events
             if e.kind == "decode" or e.kind.startswith("spec"))


def arm_sweep(model, prompts, rows_list, params: SamplingParams, engine_cfg: EngineConfig,
              spec: SpecConfig, key, pad_id=0, repeats=2, drafter=None) -> list[dict]:
  """Speedup of each arm alone against plain decoding when a rollout starts at `rows` live rows
  (the first `rows` prompts, one sample each, speculating from the first step; no bandit, no
  fallback): the table of speedup against batch size that explains the bandit's choices. Times
  are decode seconds (prefill is the same for both), best of `repeats` warm runs."""
  engine_cfg = dataclasses.replace(engine_cfg, precompile=False)

  def best(engine, rows):
    engine.generate(prompts[:rows], 1, params, key)  # warm
    runs = [engine.generate(prompts[:rows], 1, params, key) for _ in range(repeats)]
    return runs[0], min(_decode_s(r.timeline) for r in runs)

  plain_engine = RolloutEngine(model, engine_cfg, pad_id=pad_id)
  table = []
  for rows in rows_list:
    plain, plain_s = best(plain_engine, rows)
    for arm in spec.arms:
      if arm.proposer == "plain":
        continue
      one = dataclasses.replace(spec, threshold=max(engine_cfg.batch_buckets), arms=(arm,),
                                min_accept_len=0.0, epsilon=0.0)
      engine = RolloutEngine(model, engine_cfg, pad_id=pad_id, spec=one, drafter=drafter)
      sd, sd_s = best(engine, rows)
      table.append({"rows": rows, "arm": arm.name, "plain_s": round(plain_s, 4),
                    "sd_s": round(sd_s, 4), "speedup": round(plain_s / sd_s, 3),
                    "accept_len": round(engine.spec.accept_len(), 3),
                    "identical": bool(np.array_equal(plain.tokens, sd.tokens))})
  return table


def greedy_params(params: SamplingParams) -> SamplingParams:
  return dataclasses.replace(params, temperature=0.0, top_k=0, top_p=1.0)
