"""The same GRPO run as smollm2_baseline (`base.smollm2_run`), with speculative decoding in the
rollout (`coupled` rule: the same run, token for token). This run has no trained drafter, so the
arms are the model-free suffix proposer and plain decoding, which the bandit keeps when
speculation does not pay.

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
  c = base.smollm2_run("smollm2_tlt", small=variant == "small")
  c.spec = base.spec((("suffix", 3, 3), ("suffix", 6, 3), ("plain", 1, 0)), threshold=4)
  return c
