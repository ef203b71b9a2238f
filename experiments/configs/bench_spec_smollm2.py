"""Speculative-decoding benchmark on SmolLM2-135M-Instruct with the word problems, temperature 0.9
as in TLT. Thresholds and arms follow the measured c(B, T) in docs/BENCHMARKS.md: at batch 1-2 a
verify of 4-8 tokens costs little more than one decode step; at batch 8 it costs 2x or more.

Run:
  python -m experiments.bench_spec --config=experiments/configs/bench_spec_smollm2.py
"""

import ml_collections

from experiments.configs import bench_rollout_smollm2


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  c = bench_rollout_smollm2.get_config("small" if variant == "small" else "")
  c.spec = ml_collections.ConfigDict(dict(
      threshold=4, rule="coupled", epsilon=0.1, window=300, min_accept_len=1.05,
      health_window=64, seed=0, arms=(("suffix", 3, 3), ("suffix", 6, 3))))
  c.repeats = 1
  if variant and variant != "small":
    raise ValueError(f"Unknown variant {variant!r}; use '' or 'small'.")
  return c
