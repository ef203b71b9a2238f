"""The same GRPO run as tiny_baseline (`base.tiny_run`), with speculative decoding in the rollout
(`coupled` rule: the same run, token for token) and the warmed-up EAGLE drafter, which keeps
adapting to the policy (spot training from captured hidden states, checked publishing) on rollout
shards that finish early (`rollout.engine.num_shards` > 1; on CPU with fake devices). With one
device there is no idle window, and this recipe gives it no budget: it only checks and publishes
(`drafter/overhead` is that check's share of the step); set `drafter.adaptive.spot.budget_s`
(seconds), `budget_share` (of the rollout's) or `budget_steps` to train between the rollout and
the update, at that cost in wall time. The `small` variant trains two drafter steps per RL step.
The final policy and drafter are exported to `out_dir/export`.

Run:
  python -m experiments.train_grpo --config=experiments/configs/tiny_tlt.py
Small CPU variant (tests):
  python -m experiments.train_grpo --config=experiments/configs/tiny_tlt.py:small
Several processes (the demo's shipped warm start and drafter, 5 steps of 8 prompts x 8):
  python -m experiments.launch_local --num_processes=2 -- \
      python -m experiments.train_grpo --config=experiments/configs/tiny_tlt.py:scale
"""

import ml_collections

from experiments.configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "small", "long", "scale"):
    raise ValueError(f"Unknown variant {variant!r}; use '', 'small', 'long' or 'scale'.")
  c = base.with_tlt(base.tiny_run("tiny_tlt", variant), small=variant == "small")
  return base.demo_tlt(c) if variant == "scale" else c
