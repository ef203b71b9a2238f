"""Rollout benchmark on SmolLM2-135M-Instruct with the procedural word problems.

Run:
  python -m experiments.bench_rollout --config=experiments/configs/bench_rollout_smollm2.py
"""

import ml_collections

from experiments.configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "small"):
    raise ValueError(f"Unknown variant {variant!r}; use '' or 'small'.")
  small = variant == "small"
  c = base.smollm2_workload(small)
  c.bench = ml_collections.ConfigDict(dict(
      num_prompts=2 if small else 8, group_size=2 if small else 4, layout_pool_prompts=512,
      compile_probe=False, dispatch_sweep=(), hf_compare=True, hf_new_tokens=4 if small else 32))
  return c
