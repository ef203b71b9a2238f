"""The drafter as vLLM and SGLang will serve it (`experiments.bench_served`): greedy chains of 3
on held-out word problems of SmolLM2-135M-Instruct (up to 128 new tokens), the shipped drafter
against its export, in our engine and in a PyTorch loop that knows nothing of tlt_jax.

Run:
  python -m experiments.bench_served --config=experiments/configs/bench_served.py
Another drafter (a shipped name, a drafter directory, a run's `export/drafter`, an EAGLE folder):
  python -m experiments.bench_served --config=experiments/configs/bench_served.py \
      --config.bench.drafter=runs/smollm2_tlt/export/drafter
"""

import ml_collections

from experiments.configs import base


def get_config() -> ml_collections.ConfigDict:
  c = base.smollm2_workload()
  c.rollout.update(dict(temperature=0.0, max_new_tokens=128))
  c.out_dir = "runs/bench_served"  # the exported policy and drafter
  c.bench = ml_collections.ConfigDict(dict(drafter="smollm2", num_prompts=8, depth=3))
  return c
