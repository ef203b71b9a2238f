"""Offline warm-up of the EAGLE drafter for SmolLM2-135M-Instruct on the word problems
(temperature 0.9, up to 256 new tokens, as `bench_rollout_smollm2`), with a draft vocabulary
restricted to the 4096 tokens most frequent in the target's own rollouts.

Run (about 25 minutes on 2 CPU cores; the artifact is cached under .cache/drafter):
  python -m experiments.drafter_warmup --config=experiments/configs/drafter_smollm2.py
The `unrolled` variant trains draft depths 2 and 3 as they run, on the drafter's own outputs
(`DrafterConfig.unroll_steps`, EAGLE-3's training-time test); each step costs about three:
  python -m experiments.drafter_warmup --config=experiments/configs/drafter_smollm2.py:unrolled
"""

import ml_collections

from experiments.configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "unrolled", "small", "small_unrolled"):
    raise ValueError(f"Unknown variant {variant!r}; use '', 'unrolled', 'small' or "
                     "'small_unrolled'.")
  small = variant in ("small", "small_unrolled")
  c = base.smollm2_workload(small)
  c.name = "drafter_smollm2"
  c.drafter = base.smollm2_drafter(small, unrolled=variant in ("unrolled", "small_unrolled"))
  c.drafter.eval_prompts = 2 if small else 8
  return c
