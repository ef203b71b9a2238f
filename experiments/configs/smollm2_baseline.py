"""GRPO on SmolLM2-135M-Instruct with the procedural word problems, without speculative decoding:
8 steps of 8 prompts x 8 samples (T = 0.9), held-out accuracy before the first and after the last
(~8 minutes here).

Run:
  python -m experiments.train_grpo --config=experiments/configs/smollm2_baseline.py
Small CPU variant (tests):
  python -m experiments.train_grpo --config=experiments/configs/smollm2_baseline.py:small
"""

import ml_collections

from experiments.configs import bench_rollout_smollm2


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "small"):
    raise ValueError(f"Unknown variant {variant!r}; use '' or 'small'.")
  c = bench_rollout_smollm2.get_config("small" if variant == "small" else "")
  c.name = "smollm2_baseline"
  c.out_dir = "runs/smollm2_baseline"
  c.seed = 0
  # Single-change problems with numbers up to 10: easy enough for the 135M model that groups of 8
  # get mixed rewards, which is what GRPO learns from (docs/BENCHMARKS.md has its accuracy).
  c.word_problems = ml_collections.ConfigDict(dict(min_steps=1, max_steps=1, max_value=10))
  c.num_prompts = 2048         # the training prompt pool (fresh prompts, not a few re-drawn)
  # The pool's difficulty mix (fields of word_problems; held-out evaluation keeps word_problems').
  c.train_difficulty = ml_collections.ConfigDict(dict(min_steps=1, max_steps=1, max_value=10))
  c.steps = 8
  c.prompts_per_step = 8
  c.group_size = 8
  c.temperature = 0.9
  c.max_new_tokens = 128
  c.engine.batch_buckets = (1, 2, 4, 8, 16, 32, 64)
  c.engine.max_batch = 64
  c.learner = "grpo"  # grpo | gspo (tlt_jax/rl/learner.py); its settings: the section so named
  c.grpo = ml_collections.ConfigDict(dict(clip_low=0.2, clip_high=0.28, kl_coef=0.0,
                                          normalize_std=True, aggregation="token",
                                          max_len_norm=0))
  c.gspo = ml_collections.ConfigDict(dict(clip_low=3e-4, clip_high=4e-4, kl_coef=0.0,
                                          normalize_std=True))
  c.optim = ml_collections.ConfigDict(dict(lr=1e-5, warmup_steps=1, total_steps=8,
                                           end_lr_fraction=0.1, weight_decay=0.0, clip=1.0,
                                           b1=0.9, b2=0.999))
  c.micro_batches = 4
  c.mesh = (1, 1)
  c.checkpoint_every = 5
  c.eval_every = 8             # held-out accuracy before the first step and after the last
  c.eval_prompts = 128
  c.eval_group_size = 2
  c.spec = ml_collections.ConfigDict()  # empty: no speculative decoding
  if variant == "small":
    c.num_prompts, c.steps, c.prompts_per_step, c.group_size, c.max_new_tokens = 8, 2, 2, 2, 8
    c.optim.total_steps, c.micro_batches, c.checkpoint_every = 2, 1, 1
    c.eval_every, c.eval_prompts = 0, 2
  return c
