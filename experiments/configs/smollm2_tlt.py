"""TLT on SmolLM2-135M-Instruct: the same GRPO run as smollm2_baseline (`base.smollm2_run`) with
speculative decoding in the rollout under the `coupled` rule (the same run, token for token) and
the adaptive drafter.

What it runs:
- the shipped EAGLE drafter `smollm2` as the warm start (`drafter.init_from`: loaded whatever the
  run's sampling settings, no warm-up);
- arms: the EAGLE chain of 3, an EAGLE-2 tree of depth 6 with top-4 expansion verifying its 16
  best drafts, the suffix chain of 3, and plain decoding, chosen per batch bucket by the measured
  cost model (`spec.chooser = "cost"`; the cost table is measured at start-up, cached per machine)
  from 16 live rows down;
- the adaptive drafter, trained from the rollout's captured hidden states on rollout shards that
  finish early, and on one device for `spot.budget_share` = 5 % of each rollout's seconds between
  the rollout and the update (`drafter/overhead` reports its share of the step; kept <= 10 %).
  The `small` variant (the tests') has a smaller tree, lets the bandit try every arm (on this
  CPU the cost model rightly keeps plain decoding) and trains its drafter two steps per RL step,
  far more than its short rollouts: its overhead is not a figure.

Run:
  python -m experiments.train_grpo --config=experiments/configs/smollm2_tlt.py
Small CPU variant (tests):
  python -m experiments.train_grpo --config=experiments/configs/smollm2_tlt.py:small
"""

import ml_collections

from experiments.configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "small"):
    raise ValueError(f"Unknown variant {variant!r}; use '' or 'small'.")
  small = variant == "small"
  c = base.smollm2_run("smollm2_tlt", small=small)
  c.spec = base.spec((("eagle", 3, 0), ("tree", 6, 4, 16), ("suffix", 3, 3), ("plain", 1, 0)),
                     threshold=4 if small else 16, chooser="cost")
  c.drafter = ml_collections.ConfigDict(dict(init_from="smollm2"))
  c.drafter.adaptive = base.adaptive(small)
  if small:  # a smaller tree; the bandit tries every arm (on CPU the cost model keeps plain)
    c.spec.arms = (("eagle", 3, 0), ("tree", 3, 2, 4), ("suffix", 3, 3), ("plain", 1, 0))
    c.spec.chooser = "bandit"
  else:
    c.drafter.adaptive.spot.budget_share = 0.05
  return c
