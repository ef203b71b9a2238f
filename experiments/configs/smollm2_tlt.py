"""The same GRPO run as smollm2_baseline, with speculative decoding in the rollout (`coupled`
rule: the same run, token for token). SmolLM2 has no trained drafter yet, so the arms are the
model-free suffix proposer, and plain decoding, which the bandit keeps when speculation does not
pay.

Run:
  python -m experiments.train_grpo --config=experiments/configs/smollm2_tlt.py
Small CPU variant (tests):
  python -m experiments.train_grpo --config=experiments/configs/smollm2_tlt.py:small
"""

import ml_collections

from experiments.configs import smollm2_baseline


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  c = smollm2_baseline.get_config(variant)
  c.name = "smollm2_tlt"
  c.out_dir = "runs/smollm2_tlt"
  c.spec = ml_collections.ConfigDict(dict(
      threshold=4, rule="coupled", epsilon=0.1, window=300, min_accept_len=1.05,
      health_window=64, seed=0, arms=(("suffix", 3, 3), ("suffix", 6, 3), ("plain", 1, 0))))
  return c
