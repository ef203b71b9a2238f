"""Adaptive-drafter benchmark on `tiny`: the warm-started policy drifts through GRPO steps at a
raised learning rate (the stated drift), rolled out on 2 shards with the warm-up drafter frozen
and with the adaptive drafter (the run: tiny_tlt's, `base.tiny_run` + `base.with_tlt`).

Run:
  XLA_FLAGS=--xla_force_host_platform_device_count=2 \
    python -m experiments.bench_drafter --config=experiments/configs/bench_drafter.py
Small CPU variant (tests):
  XLA_FLAGS=--xla_force_host_platform_device_count=2 \
    python -m experiments.bench_drafter --config=experiments/configs/bench_drafter.py:small
"""

import ml_collections

from experiments.configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "small"):
    raise ValueError(f"Unknown variant {variant!r}; use '' or 'small'.")
  small = variant == "small"
  c = base.with_tlt(base.tiny_run("bench_drafter", variant), small)
  c.train.steps = 3 if small else 16  # the frozen drafter must lose >= 15 % (BENCHMARKS)
  c.rl.optim.lr = 1e-3            # the drift: 5x tiny_baseline's learning rate
  c.drafter.warmup.steps = 150    # the demo's warm-up drafter (cached)
  c.rollout.engine.num_shards = 2
  c.drafter.adaptive.spot.budget_s = 1.0  # plus 1 s of one-device training per RL step
  c.train.eval_every = c.train.checkpoint_every = 0
  c.spec.arms = (("eagle", 4, 0),)
  c.spec.min_accept_len = 0.0     # measure the drafter as it is: no retirement, no fallback
  c.spec.epsilon = 0.0
  c.bench = ml_collections.ConfigDict(dict(
      drift=f"{c.train.steps} GRPO steps at lr 1e-3 (5x tiny_baseline's) from the warm start",
      eval_prompts=4 if small else 32,  # held-out prompts on which accepted lengths are measured
      eval_group_size=4, measure_depth=4))
  return c
