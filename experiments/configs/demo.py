"""The demo: the `tiny` warm start (shipped with the package), then GRPO from it: a baseline run
long enough to raise accuracy on held-out prompts it never trained on (its evaluation before
the first step, of the warm start, gives the task's properties: accuracy, the long tail of
lengths, mixed-reward groups), and a
TLT run (speculative decoding, `coupled` rule, and the adaptive drafter training on the rollout
shard that finishes first) over the baseline's first `tlt.train.steps` steps, on the same
schedule: under the `coupled` rule it is the same run, so its rewards equal the baseline's and
the speed figures compare those steps. Both split the rollout over 2 shards (2 fake CPU devices,
which the demo asks for when XLA_FLAGS is unset). Both runs start from `warm_start` and keep
their caches in `cache_dir`; their directories are `out_dir`/baseline and `out_dir`/tlt.

Run:
  make demo            # = python -m experiments.demo --config=experiments/configs/demo.py
Small CPU variant (tests):
  python -m experiments.demo --config=experiments/configs/demo.py:small
The TLT run's warm-up drafter alone (`make warmstart` ships it with the package):
  python -m experiments.drafter_warmup --config=experiments/configs/demo.py:drafter --ship
The baseline alone, e.g. to try another recipe on the same held-out set:
  XLA_FLAGS=--xla_force_host_platform_device_count=2 python -m experiments.train_grpo \
      --config=experiments/configs/demo.py:baseline --config.train.steps=80 \
      --config.rl.optim.total_steps=80 --config.train.eval_every=80
"""

import ml_collections

from experiments.configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "small", "drafter", "baseline"):
    raise ValueError(f"Unknown variant {variant!r}; use '', 'small', 'drafter' or 'baseline'.")
  small = variant == "small"
  c = ml_collections.ConfigDict()
  c.out_dir = "runs/demo"
  c.cache_dir = ""  # empty: $TLT_JAX_CACHE or <repo>/.cache
  c.warm_start = base.warm_start()  # the shipped one, in the small variant too
  c.baseline = base.tiny_run("tiny_baseline", "small" if small else "")
  c.tlt = base.with_tlt(base.tiny_run("tiny_tlt", "small" if small else ""), small)
  for run in (c.baseline, c.tlt):
    run.rollout.engine.num_shards = 2
    run.train.mesh_shape = (1, 1, 1)  # the update on the first device, as the demo's figures had it
    if not small:
      run.train.num_prompts = 50_000   # fresh prompts every step: a small pool gets memorised
      # Chains of 1-4 steps, where groups get mixed rewards: a pool of only 2-3 step chains
      # raised those and lost a third of the one-step ones (docs/BENCHMARKS.md, "The demo").
      run.task.difficulty = dict(min_steps=1, max_steps=4)
      run.train.steps = 160            # 40 / 80 / 120 / 160 steps: +0.6 / 1.5 / 1.3 / 2.2 SE
      run.rl.optim.update(dict(lr=2e-4,  # 3e-4 and 4e-4 lowered held-out accuracy
                               warmup_steps=4, total_steps=160))  # the TLT run's schedule too
      run.rl.grpo.aggregation = "token"
      run.train.micro_batches = 4      # length-sorted groups: each pays only its own padding
      run.train.eval_every = 160       # held-out accuracy before the first step and after the last
      run.train.eval_prompts, run.train.eval_group_size = 256, 8  # SE of the change ~ 1/sqrt(256)
      run.rollout.engine.max_batch = 64  # evaluation waves of a training wave's shape
      # Four batch buckets, not eight: each is a program per arm and shard for the warm-up to
      # build. Rows compact to 8 when speculation starts (threshold 8), then to 2.
      run.rollout.engine.batch_buckets = (2, 8, 32, 64)
  if not small:
    c.tlt.train.steps = 10             # the baseline's first steps, same schedule
  c.tlt.train.eval_every = 0
  # The shipped drafter (150 warm-up steps, not tiny_tlt's 300) and two proposers and the plain
  # arm: each arm is a program per batch bucket <= threshold and shard, all built by the warm-up
  # (tiny_tlt's depth-6 EAGLE arm is the costliest to compile).
  base.demo_tlt(c.tlt, small)
  if variant == "baseline":  # the baseline run's config alone (its warm start: the demo's), in
    c.baseline.out_dir = "runs/demo_baseline"  # its own directory: the demo's run stays as it is
    return c.baseline
  if variant == "drafter":  # the TLT run's config with the demo's warm start, on one device
    c.tlt.rollout.engine.num_shards = 1
    c.tlt.drafter.eval_prompts = 16  # as drafter_tiny's: held-out prompts it is judged on
    return c.tlt
  return c
