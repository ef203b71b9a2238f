"""Speculative-decoding benchmark: the engine with SD against the same engine without it (the
plain engine's best mode: same buckets, compaction and steps per dispatch), warm, same prompts and
keys. Speed is a ratio of decode times measured in one process (see `sd_speedup` for the
`rejection` rule, whose outputs differ from plain decoding's)."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from tlt_jax.drafter.proposer import as_proposer
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.spec.strategy import SpecConfig


def _decoding(e) -> bool:
  return e.kind == "decode" or e.kind.startswith("spec")


def _by_bucket(timeline, keep) -> dict:
  """{bucket: (decode seconds, tokens emitted)} over the decode events that `keep` selects."""
  out = {}
  for e in timeline.events:
    if _decoding(e) and keep(e):
      s, t = out.get(e.bucket, (0.0, 0))
      out[e.bucket] = (s + e.end - e.start, t + e.tokens)
  return out


def _decode_s(result, keep=lambda e: True) -> float:
  return sum(s for s, _ in _by_bucket(result.timeline, keep).values())


def sd_speedup(plain, sd, keep=lambda e: True) -> float | None:
  """Plain ÷ SD decode seconds over the events `keep` selects, for two rollouts of the same
  prompts and key. Where the outputs are identical (greedy, `coupled`) that is the ratio of
  times over the same tokens. Under `rejection` the outputs, and so the lengths, differ, and a
  ratio of times would measure the lengths: SD's tokens at each batch bucket are then priced at
  plain decoding's rate at that bucket (tokens per second over all its decode events there).
  None when either took no time there, or SD decoded at a bucket plain never decoded at."""
  sd_s = _decode_s(sd, keep)
  if sd_s <= 0:
    return None
  if np.array_equal(plain.tokens, sd.tokens):
    plain_s = _decode_s(plain, keep)
    return plain_s / sd_s if plain_s > 0 else None
  rate = {b: t / s for b, (s, t) in _by_bucket(plain.timeline, lambda e: True).items() if t}
  sd_tokens = {b: t for b, (_, t) in _by_bucket(sd.timeline, keep).items()}
  if any(b not in rate for b in sd_tokens):
    return None
  return sum(t / rate[b] for b, t in sd_tokens.items()) / sd_s


def _round(x: float | None) -> float | None:
  return None if x is None else round(x, 3)


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
  sd_engine = RolloutEngine(model, engine_cfg, pad_id=pad_id, spec=spec,
                            drafter=as_proposer(drafter))
  plain, plain_s = _best_of(plain_engine, prompts, g, params, key, repeats)
  sd_engine.spec.reset_stats()
  sd, sd_s = _best_of(sd_engine, prompts, g, params, key, repeats)
  in_phase = lambda e: e.live <= spec.threshold
  pb_plain, pb_sd = _by_bucket(plain.timeline, in_phase), _by_bucket(sd.timeline, in_phase)
  table = {str(b): {"plain_s": round(pb_plain.get(b, (0.0,))[0], 4), "sd_s": round(s, 4),
                    "speedup": _round(sd_speedup(
                        plain, sd, lambda e, b=b: in_phase(e) and e.bucket == b))}
           for b, (s, _) in sorted(pb_sd.items())}
  summary = sd_engine.spec.summary()
  return {
      "identical": bool(np.array_equal(plain.tokens, sd.tokens)),
      # Rows whose tokens differ: 0 in float32 (greedy, coupled); in bf16 a verify of T tokens
      # and a decode step need not round alike, so a near-tie may break the other way.
      "differing_rows": float(np.mean(np.any(plain.tokens != sd.tokens, axis=1))),
      # Whole rollouts: tokens per second (the ratio of wall times where outputs are identical).
      "rollout_speedup": round((sd.timeline.tokens / sd_s) / (plain.timeline.tokens / plain_s), 3),
      "sd_phase_speedup": _round(sd_speedup(plain, sd, in_phase)),
      "accept_len": summary["accept_len"],
      "chosen_per_bucket": summary["chosen_per_bucket"],
      "accept_len_per_arm": summary["accept_len_per_arm"],
      "retired": summary["retired"],
      "plain_s": round(plain_s, 3), "sd_s": round(sd_s, 3),
      "sd_on_fraction": sd.timeline.summary()["sd_on_fraction"],
      "per_bucket": table,
      "length_p50": float(np.percentile(sd.lengths, 50)), "length_max": int(sd.lengths.max()),
  }


def arm_sweep(model, prompts, rows_list, params: SamplingParams, engine_cfg: EngineConfig,
              spec: SpecConfig, key, pad_id=0, repeats=2, drafter=None) -> list[dict]:
  """Speedup of each arm alone against plain decoding when a rollout starts at `rows` live rows
  (the first `rows` prompts, one sample each, speculating from the first step; no bandit, no
  fallback): the table of speedup against batch size that explains the bandit's choices. Times
  are decode seconds (prefill is the same for both), best of `repeats` warm runs; speedups are
  `sd_speedup`'s."""
  engine_cfg = dataclasses.replace(engine_cfg, precompile=False)

  def best(engine, rows):
    engine.generate(prompts[:rows], 1, params, key)  # warm
    runs = [engine.generate(prompts[:rows], 1, params, key) for _ in range(repeats)]
    return min(runs, key=_decode_s)

  plain_engine = RolloutEngine(model, engine_cfg, pad_id=pad_id)
  table = []
  for rows in rows_list:
    plain = best(plain_engine, rows)
    for arm in spec.arms:
      if arm.is_plain:
        continue
      one = dataclasses.replace(spec, threshold=max(engine_cfg.batch_buckets), arms=(arm,),
                                min_accept_len=0.0, epsilon=0.0)
      engine = RolloutEngine(model, engine_cfg, pad_id=pad_id, spec=one,
                             drafter=as_proposer(drafter))
      sd = best(engine, rows)
      table.append({"rows": rows, "arm": arm.name, "plain_s": round(_decode_s(plain), 4),
                    "sd_s": round(_decode_s(sd), 4),
                    "speedup": _round(sd_speedup(plain, sd)),
                    "accept_len": round(engine.spec.accept_len(), 3),
                    "identical": bool(np.array_equal(plain.tokens, sd.tokens)),
                    "differing_rows": float(np.mean(np.any(plain.tokens != sd.tokens, axis=1)))})
  return table


def greedy_params(params: SamplingParams) -> SamplingParams:
  return dataclasses.replace(params, temperature=0.0, top_k=0, top_p=1.0)
