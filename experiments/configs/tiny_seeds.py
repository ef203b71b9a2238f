"""A sweep: the tiny baseline at two seeds (the seed-to-seed spread that a `rejection`-rule TLT
run is compared against), one run directory per point.

Run:
  python -m experiments.sweep --config=experiments/configs/tiny_seeds.py
  python -m experiments.sweep --config=experiments/configs/tiny_seeds.py:tlt_rejection
"""

import ml_collections

from experiments.configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "tlt_rejection", "small"):
    raise ValueError(f"Unknown variant {variant!r}; use '', 'tlt_rejection' or 'small'.")
  c = base.tiny_run(f"tiny_seeds_{variant or 'baseline'}", "small" if variant == "small" else "")
  if variant == "tlt_rejection":
    c = base.with_tlt(c)
    c.spec.rule = "rejection"
    c.drafter.warmup.steps = 150  # the demo's warm-up drafter
  c.sweep = ml_collections.ConfigDict({"seed": (0, 1)})
  return c
