"""Speculative-decoding benchmark on the `tiny` long-tail workload (suffix proposer).

Run:
  python -m experiments.bench_spec --config=experiments/configs/bench_spec_tiny.py
Small CPU variant (tests):
  python -m experiments.bench_spec --config=experiments/configs/bench_spec_tiny.py:small
"""

import ml_collections

from experiments.configs import drafter_tiny


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  c = drafter_tiny.get_config("small" if variant == "small" else "")  # the drafter's warm-up
  c.num_prompts = 16 if variant != "small" else 4
  c.temperature = 0.9
  c.spec = ml_collections.ConfigDict(dict(
      threshold=8, rule="coupled", epsilon=0.1, window=300, min_accept_len=1.05,
      health_window=64, seed=0,
      arms=(("eagle", 3, 0), ("eagle", 6, 0), ("suffix", 4, 3))))  # (proposer, depth, ngram)
  c.repeats = 2
  if variant == "small":
    c.spec.threshold = 16  # the small run's 16 rows speculate from the start
    # No depth-6 arm, the costliest to compile (each arm's exactness is also a unit test's).
    c.spec.arms = (("eagle", 3, 0), ("suffix", 4, 3))
  if variant and variant != "small":
    raise ValueError(f"Unknown variant {variant!r}; use '' or 'small'.")
  return c
