"""The demo: warm start the `tiny` policy on the built-in task, then a sampling run.

Run:
  make demo            # = python -m experiments.demo --config=experiments/configs/demo.py
Small CPU variant (tests):
  python -m experiments.demo --config=experiments/configs/demo.py:small
"""

import ml_collections

from experiments.configs import sft_tiny


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.sft = sft_tiny.get_config(variant)
  c.eval = ml_collections.ConfigDict(dict(num_prompts=128, group_size=8, temperature=1.0,
                                          seed=4321))
  if variant == "small":
    c.eval.num_prompts = 8
    c.eval.group_size = 4
  return c
