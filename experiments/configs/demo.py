"""The demo: the `tiny` warm start (shipped with the package), the task's properties, then GRPO
from it: a baseline run long enough to raise held-out accuracy, and a TLT run (speculative
decoding, `coupled` rule, and the adaptive drafter training on the rollout shard that finishes
first) over the baseline's first `tlt.steps` steps, on the same schedule: under the `coupled` rule
it is the same run, so its rewards equal the baseline's and the speed figures compare those
steps. Both split the rollout over 2 shards (2 fake CPU devices, which the demo asks for when
XLA_FLAGS is unset).

Run:
  make demo            # = python -m experiments.demo --config=experiments/configs/demo.py
Small CPU variant (tests):
  python -m experiments.demo --config=experiments/configs/demo.py:small
The TLT run's warm-up drafter alone (`make warmstart` ships it with the package):
  python -m experiments.drafter_warmup --config=experiments/configs/demo.py:drafter --ship
"""

import ml_collections

from experiments.configs import sft_tiny, tiny_baseline, tiny_tlt


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "small", "drafter"):
    raise ValueError(f"Unknown variant {variant!r}; use '', 'small' or 'drafter'.")
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
      run.num_prompts = 50_000       # fresh prompts every step: a small pool gets memorised
      run.steps = run.optim.total_steps = 40
      run.optim.lr = 1e-4            # 4e-4 lowered held-out accuracy over 40 steps (BENCHMARKS)
      run.optim.warmup_steps = 4
      run.grpo.aggregation = "token"
      run.micro_batches = 4          # length-sorted groups: each pays only its own padding
      run.eval_every = run.steps     # held-out accuracy before the first step and after the last
      run.eval_prompts, run.eval_group_size = 256, 8  # SE of the paired change ~ 1/sqrt(256)
      run.warmup.steps = 150         # a shorter drafter warm-up than drafter_tiny's 300 steps
      run.engine.max_batch = 64      # evaluation waves of a training wave's shape: shared programs
      # Four batch buckets, not eight: each is a program per arm and shard for the warm-up to
      # build. Rows compact to 8 when speculation starts (threshold 8), then to 2.
      run.engine.batch_buckets = (2, 8, 32, 64)
  c.tlt.steps = 10 if not small else c.tlt.steps  # the baseline's first steps, same schedule
  c.tlt.eval_every = 0
  # Two proposers and the plain arm: each arm is a program per batch bucket <= threshold and
  # shard, all built by the warm-up (tiny_tlt's depth-6 EAGLE arm is the costliest to compile).
  c.tlt.spec.arms = (("eagle", 3, 0), ("suffix", 4, 3), ("plain", 1, 0))
  if small:
    c.eval.num_prompts, c.eval.group_size = 8, 4
  if variant == "drafter":  # the TLT run's config with the demo's warm start, on one device
    c.tlt.sft = c.sft
    c.tlt.engine.num_shards = 1
    return c.tlt
  return c
