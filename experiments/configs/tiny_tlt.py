"""The same GRPO run as tiny_baseline, with speculative decoding in the rollout (`coupled` rule:
the same run, token for token) and the warmed-up EAGLE drafter.

Run:
  python -m experiments.train_grpo --config=experiments/configs/tiny_tlt.py
Small CPU variant (tests):
  python -m experiments.train_grpo --config=experiments/configs/tiny_tlt.py:small
"""

import ml_collections

from experiments.configs import tiny_baseline


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  c = tiny_baseline.get_config(variant)
  c.name = "tiny_tlt"
  c.out_dir = "runs/tiny_tlt"
  c.spec = ml_collections.ConfigDict(dict(
      threshold=8 if variant != "small" else 16, rule="coupled", epsilon=0.1, window=300,
      min_accept_len=1.05, health_window=64, seed=0,
      arms=(("eagle", 3, 0), ("eagle", 6, 0), ("suffix", 4, 3))))
  return c
