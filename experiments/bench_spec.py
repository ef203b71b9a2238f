"""Speculative decoding against the plain engine's best mode; the last line is one JSON object.

  python -m experiments.bench_spec --config=experiments/configs/bench_spec_smollm2.py
  python -m experiments.bench_spec --config=experiments/configs/bench_spec_tiny.py
In bf16 (`--config.model.compute_dtype=bfloat16`) `differing_rows` is the fraction of rows where
SD and plain decoding part (float32: 0).
"""

import json
import time

import jax
from ml_collections import config_flags

from experiments import launch
from experiments.benchmarks import spec as bench
from tlt_jax.drafter.costs import cost_table_for
from tlt_jax.rollout.engine import EngineConfig
from tlt_jax.sft import default_cache_dir
from tlt_jax.spec.strategy import spec_config_from_dict
from tlt_jax.workloads import (build_drafter, build_workload, drafter_recipe, starting_policy,
                               workload_config)

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/bench_spec_tiny.py")


def main(argv):
  del argv
  c = _CONFIG.value
  wc, ecfg, b = workload_config(c), EngineConfig.from_dict(c.rollout.engine), c.bench
  spec = spec_config_from_dict(c.spec)
  # The arm sweep may try arms the bandit is not given (`sweep_arms`).
  sweep_spec = spec_config_from_dict({**c.spec, "arms": b.sweep_arms or c.spec.arms})
  drafter, policy = None, starting_policy(wc)
  if any(a.uses_drafter for a in sweep_spec.arms + spec.arms):  # this policy's warm-up drafter
    drafter, meta = build_drafter(wc, drafter_recipe(c.drafter, ("adaptive",)), c.seed,
                                  policy=policy)
    print(f"drafter: {meta['cache']}")
  w = build_workload(wc, b.num_prompts, c.seed, policy=policy)
  key = jax.random.key(c.seed)
  args = (w.model, w.prompts, b.group_size)
  costs = None
  if spec.chooser == "cost":  # measured once per machine, then cached
    longest = max(map(len, w.prompts)) + w.params.max_new_tokens + spec.max_written + 1
    costs, loaded = cost_table_for(w.model, drafter, spec, ecfg.batch_buckets, longest,
                                   wc.cache_dir or default_cache_dir())
    print(f"cost table {'loaded' if loaded else 'measured'}: {costs.to_json()}")
  sampled = greedy = None
  if b.controller:  # False: the arm sweep alone
    sampled = bench.compare(*args, w.params, ecfg, spec, key, w.tokenizer.pad_id, b.repeats,
                            drafter=drafter, costs=costs)
    print(f"temperature {wc.temperature}: {json.dumps(sampled)}")
    greedy = bench.compare(*args, bench.greedy_params(w.params), ecfg, spec, key,
                           w.tokenizer.pad_id, b.repeats, drafter=drafter, costs=costs)
    print(f"greedy: {json.dumps(greedy)}")
  sweep = []
  if b.sweep_rows:
    sweep = bench.arm_sweep(w.model, w.prompts, tuple(b.sweep_rows), w.params, ecfg, sweep_spec,
                            key, w.tokenizer.pad_id, b.sweep_repeats, drafter=drafter,
                            ignore_eos=b.ignore_eos)
    print_sweep(sweep, wc.temperature, b.sweep_repeats, b.ignore_eos)
  out = {"model": wc.name, "compute_dtype": wc.precision.compute_dtype,
         "cache_dtype": ecfg.cache_dtype or wc.precision.compute_dtype,
         "rule": spec.rule, "threshold": spec.threshold,
         "rows": b.num_prompts * b.group_size, "temperature": wc.temperature,
         "chooser": spec.chooser,
         **(controller_report(sampled, greedy, spec.rule) if sampled else {}),
         "arm_sweep": sweep,
         "date": time.strftime("%Y-%m-%d")}
  print(json.dumps(out))


def controller_report(sampled: dict, greedy: dict, rule: str) -> dict:
  """The controller's rollouts against plain decoding, sampled and greedy."""
  return {"sd_phase_speedup": sampled["sd_phase_speedup"],
          "rollout_speedup": sampled["rollout_speedup"], "accept_len": sampled["accept_len"],
          "accept_len_greedy": greedy["accept_len"], "greedy_exact": greedy["identical"],
          "coupled_identical": sampled["identical"] if rule == "coupled" else None,
          "differing_rows": sampled["differing_rows"],
          "differing_rows_greedy": greedy["differing_rows"],
          "chosen_per_bucket": sampled["chosen_per_bucket"],
          "predicted_vs_measured": sampled.get("predicted_vs_measured"),
          "speedup_per_bucket": {b: r["speedup"] for b, r in sampled["per_bucket"].items()}}


def print_sweep(sweep, temperature, repeats, ignore_eos) -> None:
  """The arm sweep's two tables: speed against its prediction, and the step's parts."""
  nan = float("nan")
  f = lambda x, w=8, p=3: f"{nan if x is None else x:{w}.{p}f}"
  length = "fixed length" if ignore_eos else "to eos"
  print(f"arms alone at temperature {temperature}, by rows at the start ({length}; medians of "
        f"{repeats} alternating rounds):")
  print(" rows  arm                   plain s     SD s  speedup  [min    max]  predicted  accept"
        "  to eos  differing rows")
  for r in sweep:
    print(f"{r['rows']:5d}  {r['arm']:20s} {f(r['plain_s'])} {f(r['sd_s'])} {f(r['speedup'])} "
          f"[{f(r['speedup_min'], 5, 2)} {f(r['speedup_max'], 5, 2)}] {f(r['predicted'], 10)} "
          f"{f(r['accept_len'], 7, 2)} {f(r.get('accept_len_to_eos'), 7, 2)} "
          f"{r['differing_rows']:.3f}")
  print("the speculative step's parts, ms (verify, draft and follow as the cost model prices "
        "them; SD and plain step: the fastest round's; other: the SD step beyond its parts; host: "
        "between dispatches, per step):")
  print(" rows  arm                   c(B,1)   verify    draft   follow  SD step  plain step"
        "    other     host")
  for r in sweep:
    print(f"{r['rows']:5d}  {r['arm']:20s} {f(r['c1_ms'])} {f(r.get('verify_ms'))} "
          f"{f(r.get('draft_ms'))} {f(r.get('follow_ms'))} {f(r['sd_step_ms'])} "
          f"{f(r['plain_step_ms'], 11)} {f(r['other_ms'])} {f(r['host_ms_per_step'])}")


if __name__ == "__main__":
  launch.run(main)
