"""GRPO on SmolLM2-135M-Instruct with the procedural word problems, without speculative decoding:
8 steps of 8 prompts x 8 samples (T = 0.9), held-out accuracy before the first and after the last
(~8 minutes here; the run: `base.smollm2_run`).

Run:
  python -m experiments.train_grpo --config=experiments/configs/smollm2_baseline.py
Small CPU variant (tests):
  python -m experiments.train_grpo --config=experiments/configs/smollm2_baseline.py:small
"""

import ml_collections

from experiments.configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "small"):
    raise ValueError(f"Unknown variant {variant!r}; use '' or 'small'.")
  return base.smollm2_run("smollm2_baseline", small=variant == "small")
