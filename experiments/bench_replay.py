"""Replay and the price of prompt-addressed noise (`experiments/configs/bench_replay.py` says what
runs); the last line is one JSON object.

  python -m experiments.bench_replay --config=experiments/configs/bench_replay.py
"""

import json

import numpy as np
from ml_collections import config_flags

from experiments import launch
from experiments.benchmarks import replay as bench

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/bench_replay.py")


def _accuracy(result) -> float:
  return float(result["records"][-1].get("eval/final_accuracy", np.nan))


def _rollout_s(result) -> float:
  return float(sum(r["rollout_s"] for r in result["records"][1:]))  # the first step: compiles


def main(argv):
  del argv
  c, b = _CONFIG.value, _CONFIG.value.bench
  settings = {"step": dict(noise="step"), "prompt": dict(noise="prompt"),
              "refresh": dict(noise="prompt", refresh=b.refresh)}
  names = {"step": "step", "prompt": "prompt", "refresh": f"prompt_refresh{b.refresh}"}
  runs = {}
  for seed in b.seeds:
    for name, kw in ((names[k], settings[k]) for k in b.settings):
      runs[name, seed] = bench.run(c, c.out_dir, f"{name}_seed{seed}", seed, **kw)
      print(f"[bench_replay] {name} seed {seed}: held-out accuracy "
            f"{_accuracy(runs[name, seed]):.4f}, rollout {_rollout_s(runs[name, seed]):.1f} s",
            flush=True)
  first = b.seeds[0]
  fresh = bench.run(c, c.out_dir, f"prompt_noreplay_seed{first}", first, "prompt", replay=False)
  replayed = runs["prompt", first]
  rewards = [[r["reward"] for r in x["records"]] for x in (fresh, replayed)]
  same = rewards[0] == rewards[1]
  differ = next((i for i, (a, b) in enumerate(zip(*rewards)) if a != b), None)
  fraction = [r["rollout/replay_fraction"] for r in replayed["records"]]
  speedup = _rollout_s(fresh) / _rollout_s(replayed)
  print(f"[bench_replay] seed {first}, prompt noise: rollout {_rollout_s(fresh):.1f} s without "
        f"replay, {_rollout_s(replayed):.1f} s with it ({speedup:.3f}x); rewards identical: "
        f"{same} (first differing step: {differ}); replay fraction per step from step 1: mean "
        f"{np.mean(fraction[1:]):.3f}")
  kept = bench.kept_by_gap(replayed["rows"])
  print("steps since last visit   samples   share of tokens its stored response held")
  for row in kept:
    print(f"{row['gap']:>22}   {row['samples']:7d}   {row['kept']:.3f}")
  rows_per_step = c.train.prompts_per_step * c.train.group_size
  cost = bench.chunk_cost(replayed["model"], sorted({1, rows_per_step // 8, rows_per_step}),
                          c.rollout.history.chunk, replayed["cache_len"], b.cost_iters,
                          replayed["params"])
  print(f"chunk {c.rollout.history.chunk}: B   c(B,1) ms   c(B,1+chunk) ms   in decode steps   "
        "ceiling (tokens per decode step's time)")
  for row in cost:
    print(f"{row['B']:>10}   {row['c1_ms']:9.3f}   {row['verify_ms']:15.3f}   "
          f"{row['verify_steps']:15.3f}   {row['ceiling']:.3f}")
  accuracy = {}
  for name in (names[k] for k in b.settings):
    mean, se = bench.mean_se([_accuracy(runs[name, s]) for s in b.seeds])
    accuracy[name] = {"mean": round(mean, 4), "se": round(se, 4),
                      "seeds": [round(_accuracy(runs[name, s]), 4) for s in b.seeds]}
    print(f"held-out accuracy, {name} noise: {mean:.4f} +- {se:.4f} over {len(b.seeds)} seed(s)")
  print(json.dumps({"rewards_identical": same, "first_differing_step": differ,
                    "rollout_speedup": round(speedup, 3),
                    "replay_fraction": [round(f, 4) for f in fraction], "kept_by_gap": kept,
                    "chunk_cost": cost, "accuracy": accuracy}))


if __name__ == "__main__":
  launch.run(main)
