"""Rollout benchmark on the `tiny` long-tail workload (warm-started policy, built-in task).

Run:
  python -m experiments.bench_rollout --config=experiments/configs/bench_rollout.py
Small CPU variant (tests):
  python -m experiments.bench_rollout --config=experiments/configs/bench_rollout.py:small
"""

import ml_collections

from experiments.configs import sft_tiny


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.model = "tiny"
  c.sft = sft_tiny.get_config("small" if variant == "small" else "")
  c.num_prompts = 16
  c.group_size = 8
  c.temperature = 1.0
  c.top_p = 1.0
  c.top_k = 0
  c.max_new_tokens = 0  # 0: the task's own maximum
  c.seed = 7
  c.engine = ml_collections.ConfigDict(dict(
      batch_buckets=(1, 2, 4, 8, 16, 32, 64, 128), max_batch=128,
      prefill_buckets=(16, 32, 64, 128, 256, 512), steps_per_dispatch=8, num_shards=1,
      cache_slack=0, compile_cache_dir="", precompile=False))
  c.layout_pool_prompts = 512  # the fixed cache length follows the longest of this many prompts
  c.compile_probe = False
  c.dispatch_sweep = (1, 4, 8, 16)  # steps per dispatch to time (host-sync cadence)
  c.hf_compare = False
  c.hf_new_tokens = 32
  c.word_problems = ml_collections.ConfigDict(dict(min_steps=1, max_steps=2, max_value=20))
  c.instruction = "Answer briefly."  # the smollm2 workload's prompt suffix
  if variant == "small":
    c.num_prompts, c.group_size, c.max_new_tokens = 4, 4, 24
    # Two batch buckets (16 rows compacting to 4): every bucket is programs to build.
    c.engine.batch_buckets, c.engine.max_batch = (4, 16), 16
    c.dispatch_sweep = (2,)
    c.layout_pool_prompts = 64
  elif variant:
    raise ValueError(f"Unknown variant {variant!r}; use '' or 'small'.")
  return c
