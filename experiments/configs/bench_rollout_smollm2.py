"""Rollout benchmark on SmolLM2-135M-Instruct with the procedural word problems.

Run:
  python -m experiments.bench_rollout --config=experiments/configs/bench_rollout_smollm2.py
"""

import ml_collections

from experiments.configs import bench_rollout


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  c = bench_rollout.get_config()
  c.model = "smollm2"
  c.num_prompts = 8
  c.group_size = 4
  c.temperature = 0.9
  c.max_new_tokens = 256
  c.engine.batch_buckets = (1, 2, 4, 8, 16, 32)
  c.engine.max_batch = 32
  c.engine.prefill_buckets = (64, 128, 256)
  c.engine.steps_per_dispatch = 8
  c.hf_compare = True
  c.dispatch_sweep = ()
  if variant == "small":
    c.num_prompts, c.group_size, c.max_new_tokens, c.hf_new_tokens = 2, 2, 8, 4
  elif variant:
    raise ValueError(f"Unknown variant {variant!r}; use '' or 'small'.")
  return c
