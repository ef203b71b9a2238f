"""The demo: warm start the `tiny` policy on the built-in task, check the task's properties, then
a short TLT run (GRPO with speculative decoding and the adaptive drafter, which trains on the
rollout shard that finishes first) against a baseline run of the same steps. Both runs split the
rollout over 2 shards (2 fake CPU devices, which the demo asks for when XLA_FLAGS is unset).

Run:
  make demo            # = python -m experiments.demo --config=experiments/configs/demo.py
Small CPU variant (tests):
  python -m experiments.demo --config=experiments/configs/demo.py:small
"""

import ml_collections

from experiments.configs import sft_tiny, tiny_baseline, tiny_tlt


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "small"):
    raise ValueError(f"Unknown variant {variant!r}; use '' or 'small'.")
  small = "small" if variant == "small" else ""
  c = ml_collections.ConfigDict()
  c.sft = sft_tiny.get_config(small)
  c.eval = ml_collections.ConfigDict(dict(num_prompts=128, group_size=8, temperature=1.0,
                                          seed=4321))
  c.out_dir = "runs/demo"
  c.baseline = tiny_baseline.get_config(small)
  c.tlt = tiny_tlt.get_config(small)
  for name in ("baseline", "tlt"):  # sft, out_dir and cache_dir follow c's (set by the demo)
    run = c[name]
    run.engine.num_shards = 2
    if not small:
      run.steps = run.optim.total_steps = 10
      run.eval_every = 10            # held-out accuracy before the first step and after the last
      run.eval_prompts = 128
      run.warmup.steps = 150         # a shorter drafter warm-up than drafter_tiny's 300 steps
  if small:
    c.eval.num_prompts, c.eval.group_size = 8, 4
  return c
