"""GRPO on the built-in task from the warm-started `tiny` policy, without speculative decoding.

Run:
  python -m experiments.train_grpo --config=experiments/configs/tiny_baseline.py
The recipe that clearly raises held-out accuracy (160 steps of 64 prompts x 8 on fresh prompts,
~22 min here; see docs/BENCHMARKS.md):
  python -m experiments.train_grpo --config=experiments/configs/tiny_baseline.py:long
Small CPU variant (tests):
  python -m experiments.train_grpo --config=experiments/configs/tiny_baseline.py:small
"""

import ml_collections

from experiments.configs import drafter_tiny


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "small", "long"):
    raise ValueError(f"Unknown variant {variant!r}; use '', 'small' or 'long'.")
  c = drafter_tiny.get_config("small" if variant == "small" else "")  # workload + drafter recipe
  c.name = "tiny_baseline"
  c.out_dir = "runs/tiny_baseline"
  c.num_prompts = 512          # the training prompt pool
  # The pool's difficulty mix (fields of the task config; held-out evaluation keeps the task's).
  c.train_difficulty = ml_collections.ConfigDict(dict(min_steps=1, max_steps=16))
  c.reward = "answer"          # answer | progress (partial credit for the steps before an error)
  c.steps = 20
  c.prompts_per_step = 16
  c.group_size = 8
  c.temperature = 1.0
  c.learner = "grpo"  # grpo | gspo (tlt_jax/rl/learner.py); its settings: the section so named
  c.grpo = ml_collections.ConfigDict(dict(clip_low=0.2, clip_high=0.28, kl_coef=0.0,
                                          normalize_std=True, aggregation="sequence",
                                          max_len_norm=0))
  c.gspo = ml_collections.ConfigDict(dict(clip_low=3e-4, clip_high=4e-4, kl_coef=0.0,
                                          normalize_std=True))
  c.optim = ml_collections.ConfigDict(dict(lr=2e-4, warmup_steps=2, total_steps=20,
                                           end_lr_fraction=0.1, weight_decay=0.0, clip=1.0,
                                           b1=0.9, b2=0.999))
  c.micro_batches = 1
  c.mesh = (1, 1)              # (data, fsdp) devices of the policy update
  c.checkpoint_every = 5
  c.eval_every = 5             # held-out accuracy every N steps (and at the end); 0: off
  c.eval_prompts = 64
  c.eval_group_size = 4
  c.spec = ml_collections.ConfigDict()  # empty: no speculative decoding
  if variant == "small":
    c.num_prompts, c.steps, c.prompts_per_step, c.group_size = 16, 3, 4, 4
    c.optim.total_steps = 3
    c.checkpoint_every = 1
    c.eval_every, c.eval_prompts, c.eval_group_size = 2, 4, 2
  elif variant == "long":
    c.name, c.out_dir = "tiny_baseline_long", "runs/tiny_baseline_long"
    c.num_prompts = 50_000       # fresh prompts: a small pool gets memorised
    c.prompts_per_step = 64
    c.steps = c.optim.total_steps = 160
    c.optim.lr = 3e-4
    c.micro_batches = 8          # length-sorted groups: each pays only its own padding
    c.eval_every, c.eval_prompts = 20, 256
  return c
