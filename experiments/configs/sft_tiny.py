"""SFT warm start of the `tiny` policy on the built-in arithmetic task (the recipe:
`base.warm_start`).

Run:
  python -m experiments.sft_warmstart --config=experiments/configs/sft_tiny.py
Small CPU variant (tests):
  python -m experiments.sft_warmstart --config=experiments/configs/sft_tiny.py:small
"""

import ml_collections

from experiments.configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "small"):
    raise ValueError(f"Unknown variant {variant!r} of sft_tiny; use '' or 'small'.")
  return base.warm_start(small=variant == "small")
