"""Offline warm-up of the EAGLE drafter for the warm-started `tiny` policy (the recipe:
`base.tiny_drafter`, the one tiny_tlt starts from), judged on `drafter.eval_prompts` held-out
prompts.

Run:
  python -m experiments.drafter_warmup --config=experiments/configs/drafter_tiny.py
Small CPU variant (tests):
  python -m experiments.drafter_warmup --config=experiments/configs/drafter_tiny.py:small
"""

import ml_collections

from experiments.configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "small"):
    raise ValueError(f"Unknown variant {variant!r}; use '' or 'small'.")
  small = variant == "small"
  c = base.tiny_workload(small)
  c.name = "drafter_tiny"
  c.drafter = base.tiny_drafter(small)
  c.drafter.eval_prompts = 4 if small else 16
  return c
