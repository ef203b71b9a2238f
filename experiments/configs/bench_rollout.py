"""Rollout benchmark on the `tiny` long-tail workload (warm-started policy, built-in task).

Run:
  python -m experiments.bench_rollout --config=experiments/configs/bench_rollout.py
Small CPU variant (tests):
  python -m experiments.bench_rollout --config=experiments/configs/bench_rollout.py:small
"""

import ml_collections

from experiments.configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "small"):
    raise ValueError(f"Unknown variant {variant!r}; use '' or 'small'.")
  small = variant == "small"
  c = base.tiny_workload(small)
  c.bench = ml_collections.ConfigDict(dict(
      num_prompts=4 if small else 16, group_size=4 if small else 8,
      layout_pool_prompts=64 if small else 512,  # the fixed cache length follows the longest
      compile_probe=False,
      dispatch_sweep=(2,) if small else (1, 4, 8, 16),  # steps per dispatch to time
      hf_compare=False, hf_new_tokens=32))
  return c
