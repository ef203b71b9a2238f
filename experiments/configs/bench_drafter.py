"""Adaptive-drafter benchmark on `tiny`: the warm-started policy drifts through GRPO steps at a
raised learning rate (the stated drift), rolled out on 2 shards with the warm-up drafter frozen
and with the adaptive drafter.

Run:
  XLA_FLAGS=--xla_force_host_platform_device_count=2 \
    python -m experiments.bench_drafter --config=experiments/configs/bench_drafter.py
Small CPU variant (tests):
  XLA_FLAGS=--xla_force_host_platform_device_count=2 \
    python -m experiments.bench_drafter --config=experiments/configs/bench_drafter.py:small
"""

import ml_collections

from experiments.configs import tiny_tlt


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "small"):
    raise ValueError(f"Unknown variant {variant!r}; use '' or 'small'.")
  c = tiny_tlt.get_config("small" if variant == "small" else "")
  c.name = "bench_drafter"
  c.out_dir = "runs/bench_drafter"
  c.steps = c.optim.total_steps = 12
  c.optim.lr = 1e-3            # the drift: 5x tiny_baseline's learning rate
  c.drift = "12 GRPO steps at lr 1e-3 (5x tiny_baseline's) from the warm start"
  c.warmup.steps = 150         # the demo's warm-up drafter (cached)
  c.engine.num_shards = 2
  c.adaptive.spot.budget_s = 1.0  # plus 1 s of one-device training per RL step (as measured)
  c.eval_every = 0
  c.checkpoint_every = 0
  c.eval_prompts = 32          # held-out prompts on which accepted lengths are measured
  c.eval_group_size = 4
  c.measure_depth = 4
  c.spec.arms = (("eagle", 4, 0),)
  c.spec.min_accept_len = 0.0   # measure the drafter as it is: no retirement, no fallback
  c.spec.epsilon = 0.0
  if variant == "small":
    c.steps = c.optim.total_steps = 3
    c.eval_prompts = 4
    c.drift = "3 GRPO steps at lr 1e-3"
  return c
