"""Speculative-decoding benchmark on the `tiny` long-tail workload: the EAGLE chains of 3 and 6
with tiny_tlt's warm-up drafter, and the suffix chain.

Run:
  python -m experiments.bench_spec --config=experiments/configs/bench_spec_tiny.py
Small CPU variant (tests):
  python -m experiments.bench_spec --config=experiments/configs/bench_spec_tiny.py:small
"""

import ml_collections

from experiments.configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "small"):
    raise ValueError(f"Unknown variant {variant!r}; use '' or 'small'.")
  small = variant == "small"
  c = base.tiny_workload(small)
  c.rollout.temperature = 0.9
  c.drafter = base.tiny_drafter(small)
  # The small run's 16 rows speculate from the start, and the bandit tries every arm (priced by
  # the cost model, none pays on this CPU, where a verify of T tokens costs nearly T decode steps
  # of `tiny`, and no step would speculate); it has no depth-6 arm, the costliest to compile
  # (each arm's exactness is also a unit test's).
  c.spec = base.spec((("eagle", 3, 0), ("suffix", 4, 3)) if small
                     else (("eagle", 3, 0), ("eagle", 6, 0), ("suffix", 4, 3)),
                     **(dict(threshold=16, chooser="bandit") if small else {}))
  c.bench = ml_collections.ConfigDict(dict(
      num_prompts=4 if small else 16, group_size=4 if small else 8, repeats=2, controller=True,
      sweep_rows=(), sweep_arms=(), sweep_repeats=0, ignore_eos=False))
  return c
