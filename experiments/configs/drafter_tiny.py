"""Offline warm-up of the EAGLE drafter for the warm-started `tiny` policy.

Run:
  python -m experiments.drafter_warmup --config=experiments/configs/drafter_tiny.py
Small CPU variant (tests):
  python -m experiments.drafter_warmup --config=experiments/configs/drafter_tiny.py:small
"""

import ml_collections

from experiments.configs import bench_rollout


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  c = bench_rollout.get_config("small" if variant == "small" else "")
  c.num_prompts = 64
  c.warmup_prompts = 64  # prompts whose rollouts train the drafter (bench_spec reuses these keys)
  c.temperature = 1.0
  c.drafter = ml_collections.ConfigDict(dict(feature_layers=(), smooth_l1_weight=1.0,
                                             ce_weight=0.1))
  c.drafter_train = ml_collections.ConfigDict(dict(lr=3e-3, warmup_steps=20, weight_decay=1e-2,
                                                   clip=1.0))
  c.warmup = ml_collections.ConfigDict(dict(steps=300, batch_rows=32, seq_len=256, group_size=4,
                                            seed=0))
  c.eval_prompts = 16
  c.cache_dir = ""  # empty: $TLT_JAX_CACHE or <repo>/.cache
  if variant == "small":
    c.num_prompts, c.warmup.steps, c.warmup.batch_rows, c.eval_prompts = 8, 10, 8, 4
    c.warmup_prompts = 8
  elif variant:
    raise ValueError(f"Unknown variant {variant!r}; use '' or 'small'.")
  return c
