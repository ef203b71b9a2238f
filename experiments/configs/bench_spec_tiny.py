"""Speculative-decoding benchmark on the `tiny` long-tail workload (suffix proposer).

Run:
  python -m experiments.bench_spec --config=experiments/configs/bench_spec_tiny.py
Small CPU variant (tests):
  python -m experiments.bench_spec --config=experiments/configs/bench_spec_tiny.py:small
"""

import ml_collections

from experiments.configs import bench_rollout


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  c = bench_rollout.get_config("small" if variant == "small" else "")
  c.temperature = 0.9
  c.spec = ml_collections.ConfigDict(dict(
      threshold=8, rule="coupled", epsilon=0.1, window=300, min_accept_len=1.05,
      health_window=64, seed=0,
      arms=(("suffix", 2, 3), ("suffix", 4, 3), ("suffix", 8, 4))))  # (proposer, depth, ngram)
  c.repeats = 2
  if variant == "small":
    c.spec.threshold = 16  # the small run's 16 rows speculate from the start
  if variant and variant != "small":
    raise ValueError(f"Unknown variant {variant!r}; use '' or 'small'.")
  return c
