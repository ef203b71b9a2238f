"""GRPO on the built-in task from the warm-started `tiny` policy, without speculative decoding:
20 steps of 16 prompts x 8 samples (the run: `base.tiny_run`).

Run:
  python -m experiments.train_grpo --config=experiments/configs/tiny_baseline.py
The recipe that clearly raises held-out accuracy (160 steps of 64 prompts x 8 on fresh prompts,
~22 min here; see docs/BENCHMARKS.md):
  python -m experiments.train_grpo --config=experiments/configs/tiny_baseline.py:long
Small CPU variant (tests):
  python -m experiments.train_grpo --config=experiments/configs/tiny_baseline.py:small
"""

import ml_collections

from experiments.configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "small", "long"):
    raise ValueError(f"Unknown variant {variant!r}; use '', 'small' or 'long'.")
  return base.tiny_run("tiny_baseline", variant)
