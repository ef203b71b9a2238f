"""Speculative-decoding benchmark on SmolLM2-135M-Instruct with the word problems, temperature 0.9
as in TLT, with the shipped warm-up drafter `smollm2` (`drafter_smollm2.py`; trained and cached
first only if its recipe changed).

The controller's arms are the EAGLE chain of 3, the suffix chain of 3 and plain decoding, chosen
per batch bucket by the measured cost model (`spec.chooser = "cost"`: each arm's speed predicted
from c(B, T) and its running acceptance; the table is measured at start-up and cached per
machine). It may speculate from 4 live rows: this workload's 32 rows end with 3 runaways decoding
to 256 tokens together, about half the rollout's steps, and with the cost chooser the threshold
only bounds where an arm is tried, not where one is used. The arm sweep runs each arm alone from
1, 2 and 4 live rows, every row decoding exactly 256 tokens, in 5 rounds alternating with plain
decoding, beside each cell its prediction from the costs measured in the same run and the step's
parts.

Run (the `rejection` variant speculates with the rejection rule instead of `coupled`; `bandit`
chooses arms by measured tokens per second instead; `teacher_forced` uses the drafter of
`drafter_smollm2.py:teacher_forced`, TLT's recipe):
  python -m experiments.bench_spec --config=experiments/configs/bench_spec_smollm2.py
  python -m experiments.bench_spec --config=experiments/configs/bench_spec_smollm2.py:rejection
The controller alone, without the arm sweep (~13 minutes instead of ~70), and the sweep alone
(here the EAGLE chains of 2 and 3 from 1 and 2 live rows):
  python -m experiments.bench_spec --config=experiments/configs/bench_spec_smollm2.py \
      --config.bench.sweep_rows='()'
  python -m experiments.bench_spec --config=experiments/configs/bench_spec_smollm2.py:rejection \
      --config.bench.controller=False --config.bench.sweep_rows='(1, 2)' \
      --config.bench.sweep_arms='(("eagle", 2, 0), ("eagle", 3, 0))'
"""

import ml_collections

from experiments.configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  variants = ("", "small", "rejection", "bandit", "teacher_forced")
  if variant not in variants:
    raise ValueError(f"Unknown variant {variant!r}; use one of {variants}.")
  small = variant == "small"
  c = base.smollm2_workload(small)
  c.drafter = base.smollm2_drafter(small, teacher_forced=variant == "teacher_forced")
  c.spec = base.spec((("eagle", 3, 0), ("suffix", 3, 3), ("plain", 1, 0)), threshold=4,
                     chooser="bandit" if variant == "bandit" else "cost")
  if variant == "rejection":
    c.spec.rule = "rejection"
  c.bench = ml_collections.ConfigDict(dict(
      num_prompts=2 if small else 8, group_size=2 if small else 4, repeats=2 if small else 3,
      controller=True,  # the controller's rollouts against plain decoding (False: the sweep alone)
      # Each arm alone from these live batches (speedup against batch size), every row decoding
      # exactly max_new_tokens, in alternating rounds with plain decoding.
      sweep_rows=(1, 2) if small else (1, 2, 4), ignore_eos=True, sweep_repeats=2 if small else 5,
      sweep_arms=(("eagle", 2, 0), ("eagle", 3, 0), ("eagle", 4, 0), ("suffix", 3, 3))))
  return c
