"""Offline warm-up of the EAGLE drafter for SmolLM2-135M-Instruct on the word problems (the
`bench_rollout_smollm2` workload: temperature 0.9, up to 256 new tokens), with a draft vocabulary
restricted to the 4096 tokens most frequent in the target's own rollouts.

Run (about 25 minutes on 2 CPU cores; the artifact is cached under .cache/drafter):
  python -m experiments.drafter_warmup --config=experiments/configs/drafter_smollm2.py
The `unrolled` variant trains draft depths 2 and 3 as they run, on the drafter's own outputs
(`DrafterConfig.unroll_steps`, EAGLE-3's training-time test); each step costs about three:
  python -m experiments.drafter_warmup --config=experiments/configs/drafter_smollm2.py:unrolled
"""

import ml_collections

from experiments.configs import bench_rollout_smollm2


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  small = variant in ("small", "small_unrolled")
  c = bench_rollout_smollm2.get_config("small" if small else "")
  c.warmup_prompts = 256  # prompts (seed + 1) whose rollouts train the drafter
  c.drafter = ml_collections.ConfigDict(dict(feature_layers=(), smooth_l1_weight=1.0,
                                             ce_weight=0.5, draft_vocab=4096))
  c.drafter_train = ml_collections.ConfigDict(dict(lr=1e-3, warmup_steps=30, weight_decay=1e-2,
                                                   clip=1.0))
  c.warmup = ml_collections.ConfigDict(dict(steps=600, batch_rows=16, seq_len=384, group_size=4,
                                            seed=0))
  c.eval_prompts = 8
  c.cache_dir = ""  # empty: $TLT_JAX_CACHE or <repo>/.cache
  if small:
    c.warmup_prompts, c.warmup.steps, c.warmup.batch_rows, c.eval_prompts = 4, 4, 4, 2
    c.drafter.draft_vocab = 512
  if variant in ("unrolled", "small_unrolled"):
    c.drafter.unroll_steps, c.drafter.unroll_decay = 3, 0.8
  elif variant not in ("", "small"):
    raise ValueError(f"Unknown variant {variant!r}; use '', 'unrolled', 'small' or "
                     "'small_unrolled'.")
  return c
