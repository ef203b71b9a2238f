"""Speculative-decoding benchmark: the engine with SD against the same engine without it (the
plain engine's best mode: same buckets, compaction and steps per dispatch), warm, same prompts and
keys. Speed is a ratio of decode times measured in one process (see `sd_speedup` for the
`rejection` rule, whose outputs differ from plain decoding's)."""

from __future__ import annotations

import dataclasses
import functools
import time

import numpy as np

from tlt_jax.drafter.costs import measure_cost_table, needed_cells
from tlt_jax.drafter.proposer import as_proposer
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.rollout.pool import warm_concurrently
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


def same_cache(engine_cfg: EngineConfig, spec: SpecConfig) -> EngineConfig:
  """`engine_cfg` with the cache slack that every arm of `spec` writes past a row's last token,
  so that plain decoding and each arm run over the same cache layout: the benchmark then
  measures speculation alone, not the speed of one cache length against another."""
  return dataclasses.replace(engine_cfg,
                             cache_slack=max(engine_cfg.cache_slack, spec.max_written + 1))


def _best_of(engines, prompts, g, params, key, repeats) -> list[tuple]:
  """(result, wall seconds) of each engine's fastest of `repeats` warm runs, the engines taking
  turns in each round so that all see the same moments of a shared machine (a controller's
  accepted length counts the warm runs too)."""
  for engine in engines:
    engine.generate(prompts, g, params, key)  # warm: compile every reachable executable
    engine.pool.wait()
    engine.generate(prompts, g, params, key)  # first executions of late-compiled arms
  best = [None] * len(engines)
  for _ in range(repeats):
    for i, engine in enumerate(engines):
      t0 = time.perf_counter()
      res = engine.generate(prompts, g, params, key)
      wall = time.perf_counter() - t0
      if best[i] is None or wall < best[i][1]:
        best[i] = (res, wall)
  return best


def compare(model, prompts, g, params: SamplingParams, engine_cfg: EngineConfig,
            spec: SpecConfig, key, pad_id=0, repeats=2, drafter=None, costs=None) -> dict:
  """The controller's rollout (SD below its threshold, arms by its chooser; `costs`: the `cost`
  chooser's table) against plain decoding's, best of `repeats` warm runs each, alternating.
  Both engines build every program first (`warm_up`), so that the chooser's first dispatches,
  which explore the arms, do not share the host with compiles."""
  lengths = [len(p) for p in prompts]
  engine_cfg = dataclasses.replace(engine_cfg, precompile=True,
                                   max_prompt_len=engine_cfg.max_prompt_len or max(lengths))
  sd_engine = RolloutEngine(model, engine_cfg, pad_id=pad_id, spec=spec,
                            drafter=as_proposer(drafter), costs=costs)
  plain_engine = RolloutEngine(model, same_cache(engine_cfg, spec), pad_id=pad_id)
  for engine in (plain_engine, sd_engine):
    engine.warm_up([(len(prompts), g)], params, lengths, progress=False)
  (plain, plain_s), (sd, sd_s) = _best_of((plain_engine, sd_engine), prompts, g, params, key,
                                           repeats)
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
      "predicted_vs_measured": summary.get("predicted_vs_measured"),
      "retired": summary["retired"],
      "plain_s": round(plain_s, 3), "sd_s": round(sd_s, 3),
      "sd_on_fraction": sd.timeline.summary()["sd_on_fraction"],
      "per_bucket": table,
      "length_p50": float(np.percentile(sd.lengths, 50)), "length_max": int(sd.lengths.max()),
  }


def _step_s(result, keep=_decoding) -> float:
  """Seconds per dispatched step over the events `keep` selects."""
  ev = [e for e in result.timeline.events if keep(e)]
  steps = sum(e.steps for e in ev)
  return sum(e.end - e.start for e in ev) / steps if steps else float("nan")


def _host_s(result) -> float:
  """The rollout's wall time outside every dispatch (host work between them)."""
  return result.timeline.wall_s - sum(e.end - e.start for e in result.timeline.events)


def sweep_costs(model, drafter, prompts, rows_list, spec: SpecConfig, max_new: int, slack: int):
  """c(B, T) and d(B, T) for every arm of the sweep at its row counts, measured now, over a cache
  of a rollout's length and a prefix of a row's mean length half-way through."""
  target_cells, draft_cells = needed_cells(
      dataclasses.replace(spec, threshold=max(rows_list)), sorted(rows_list))
  if drafter is None:
    draft_cells = set()
  longest = max(len(p) for p in prompts[:max(rows_list)])
  prefix = int(np.mean([len(p) for p in prompts[:max(rows_list)]])) + max_new // 2
  return measure_cost_table(model, drafter, target_cells, draft_cells,
                            longest + max_new + slack, prefix=prefix, rule=spec.rule)


def arm_sweep(model, prompts, rows_list, params: SamplingParams, engine_cfg: EngineConfig,
              spec: SpecConfig, key, pad_id=0, repeats=5, drafter=None, ignore_eos=False,
              costs=None) -> list[dict]:
  """Speed of each arm alone against plain decoding when a rollout starts at `rows` live rows
  (the first `rows` prompts, one sample each, speculating from the first step; no bandit, no
  fallback): the table of speedup against batch size that explains the chooser's picks.

  `repeats` rounds alternate plain decoding and every arm, so that all see the same moments of a
  shared machine; each cell reports the median and the spread of its rounds' speedups. With
  `ignore_eos` every row decodes exactly `max_new_tokens` (no stop token), so plain decoding and
  either rule emit the same tokens and a speedup is a plain ratio of decode seconds; the
  accepted length is then also reported to each row's first stop token (`accept_len_to_eos`,
  from one more run that stops there). Otherwise speedups are `sd_speedup`'s.

  Beside each cell: its prediction from the cost model measured in the same run (`costs`, else
  `sweep_costs` now; `spec.costs.CostTable.speedup` at the cell's fixed-length acceptance) and
  the step's parts:
  verify, draft steps and the drafter's following as the model prices them, the measured
  speculative and plain step (the fastest round's, as a cost is its fastest call's: a median
  against a minimum would read a shared machine's noise as unpriced work), what the measured
  step holds beyond the model (`other_ms`), and host time per step between dispatches.
  """
  engine_cfg = same_cache(dataclasses.replace(engine_cfg, precompile=False), spec)
  timed = dataclasses.replace(params, stop_tokens=()) if ignore_eos else params
  costs = costs or sweep_costs(model, drafter, prompts, rows_list, spec, params.max_new_tokens,
                               engine_cfg.cache_slack)
  ms = lambda x: None if x is None else round(1e3 * x, 3)
  table = []
  for rows in rows_list:
    sub = prompts[:rows]
    plain_engine = RolloutEngine(model, engine_cfg, pad_id=pad_id)
    engines = {}
    for arm in (a for a in spec.arms if not a.is_plain):
      one = dataclasses.replace(spec, threshold=max(engine_cfg.batch_buckets), arms=(arm,),
                                min_accept_len=0.0, epsilon=0.0, chooser="bandit")
      engines[arm] = RolloutEngine(model, engine_cfg, pad_id=pad_id, spec=one,
                                   drafter=as_proposer(drafter))
    warm_concurrently([functools.partial(e.generate, sub, 1, timed, key)  # compiles overlap
                       for e in (plain_engine, *engines.values())])
    for engine in engines.values():
      engine.spec.reset_stats()
    plain_runs, sd_runs = [], {arm: [] for arm in engines}
    for _ in range(repeats):
      plain_runs.append(plain_engine.generate(sub, 1, timed, key))
      for arm, engine in engines.items():
        sd_runs[arm].append(engine.generate(sub, 1, timed, key))
    for arm, engine in engines.items():
      accept = engine.spec.accept_len()
      ratios = [_decode_s(p) / _decode_s(r) if ignore_eos else sd_speedup(p, r)
                for p, r in zip(plain_runs, sd_runs[arm])]
      ratios = [x for x in ratios if x is not None]
      row = {"rows": rows, "arm": arm.name,
             "plain_s": round(float(np.median([_decode_s(p) for p in plain_runs])), 4),
             "sd_s": round(float(np.median([_decode_s(r) for r in sd_runs[arm]])), 4),
             "speedup": _round(float(np.median(ratios))) if ratios else None,
             "speedup_min": _round(min(ratios, default=None)),
             "speedup_max": _round(max(ratios, default=None)),
             "accept_len": round(accept, 3),
             "plain_tokens": plain_runs[-1].timeline.tokens,
             "sd_tokens": sd_runs[arm][-1].timeline.tokens,
             "predicted": _round(costs.speedup(arm, rows, accept, spec.rule)),
             "identical": bool(np.array_equal(plain_runs[-1].tokens, sd_runs[arm][-1].tokens)),
             "differing_rows": float(np.mean(np.any(
                 plain_runs[-1].tokens != sd_runs[arm][-1].tokens, axis=1)))}
      if ignore_eos:
        engine.spec.reset_stats()
        engine.generate(sub, 1, params, key)
        row["accept_len_to_eos"] = round(engine.spec.accept_len(), 3)
      terms = costs.step_terms(arm, rows, spec.rule) or {}
      sd_step = float(np.min([_step_s(r) for r in sd_runs[arm]]))
      row.update(c1_ms=ms(costs.target(rows, 1)), **{f"{k}_ms": ms(v) for k, v in terms.items()},
                 sd_step_ms=ms(sd_step),
                 plain_step_ms=ms(float(np.min([_step_s(p) for p in plain_runs]))),
                 other_ms=ms(sd_step - sum(terms.values())) if terms else None,
                 host_ms_per_step=ms(float(np.median(
                     [_host_s(r) / max(sum(e.steps for e in r.timeline.events), 1)
                      for r in sd_runs[arm]]))))
      table.append(row)
  return table


def greedy_params(params: SamplingParams) -> SamplingParams:
  """`params` at temperature 0 (top-k and top-p off)."""
  return dataclasses.replace(params, temperature=0.0, top_k=0, top_p=1.0)
