"""The GPU proof (`experiments.gpu_proof`): SmolLM2-135M-Instruct in bf16 with the shipped drafter
on one GPU. Its phases (`experiments/benchmarks/proof.py`) in order of value: GRPO
(`smollm2_baseline` against `smollm2_tlt`, 8 steps, bf16, held-out evaluation off: the proof
compares the two runs, not their accuracy), the costs the first rollout cells are priced with,
the rollout cells (plain against an EAGLE chain of 3 and two EAGLE-2 trees of TLT's GPU sizes,
from 1, 4, 16 and 64 rows, 256 tokens each, at T = 0.9 under `coupled` and at T = 0), the EAGLE
chain against plain sampling in the `invariant` numerics (rows equal), the `tiny` replay run
with and without replay in that numerics (the same rewards at every step), the engine's decode step
under each XLA command-buffer setting, the rest of the cost grid, and the Qwen2.5-1.5B shape's
costs and update step. docs/GPU.md says how a window runs it.

Run (on the GPU box, after the bundle's parts have travelled):
  python -m experiments.gpu_proof
The dry run (CPU, toy sizes, every phase; part of `make test-slow`):
  python -m experiments.gpu_proof --dry_run --out_dir=/tmp/proof
"""

import ml_collections

from experiments.configs import base

def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "dry_run"):
    raise ValueError(f"Unknown variant {variant!r}; use '' or 'dry_run'.")
  dry = variant == "dry_run"
  c = ml_collections.ConfigDict()
  c.variant = variant
  c.out_dir = "runs/gpu_proof"
  c.require_gpu = not dry       # without a GPU the command stops at once, with a message
  c.budget_s = 0 if dry else 540  # seconds the phases may take (0: no limit); a call has 600
  c.seed = 0
  c.model_path = ""             # SmolLM2's GGUF: set from the bundle by the launcher
  c.attention = "auto"          # pallas on a GPU
  c.prefill_buckets = (16, 32) if dry else (64, 128, 256)
  if dry:
    c.workload = base.tiny_workload(small=True)
    c.workload.rollout.temperature = 0.9
    c.drafter = "demo"
  else:
    c.workload = base.smollm2_workload()
    c.workload.model.compute_dtype = "bfloat16"
    c.workload.rollout.max_new_tokens = 256
    c.drafter = "smollm2"
  # `invariant`: coupled SD against plain sampling in the invariant numerics (every row equal)
  c.invariant = ml_collections.ConfigDict(dict(
      arms=(("eagle", 2, 0),) if dry else (("eagle", 3, 0),), rows=(1,) if dry else (1, 4),
      new_tokens=8 if dry else 128, repeats=1 if dry else 3))
  # `replay`: bench_replay.py's run of this variant, `steps` steps, with replay and without, in
  # the invariant numerics; skipped where the budget has less than `needs_s` left. A dispatch
  # replays as `dispatch` chooses (`rollout.history.dispatch`): on the GPU by the cost table; in
  # the dry run by its share of replaying rows, since on the CPU a chunk's verify costs about
  # what its tokens' decode steps do and the timed choice would replay on some runs only
  c.replay = ml_collections.ConfigDict(dict(
      variant="small" if dry else "speed", steps=2 if dry else 40, needs_s=0 if dry else 240,
      dispatch="share" if dry else "cost"))
  # XLA_FLAGS settings of `command_buffers`, each in a fresh process: XLA's own, none, and whole
  # loops captured too (the decode dispatch is a while loop of 8 steps)
  c.command_buffers = ml_collections.ConfigDict(dict(
      settings=(("default", ""), ("none", "--xla_gpu_enable_command_buffer=")) + (() if dry else (
          ("loops", "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,"
                    "WHILE,CONDITIONAL"),)),
      rows=(1,) if dry else (1, 16), prompt_len=16 if dry else 64,
      new_tokens=8 if dry else 128, timeout_s=180))
  c.costs = ml_collections.ConfigDict(dict(
      rounds=1 if dry else 3, iters=2 if dry else 10,
      batches=(1,) if dry else (1, 4, 16, 64),            # the grid of `costs_grid`
      tokens=(1, 4) if dry else (1, 4, 16, 32, 48)))
  c.rollouts = ml_collections.ConfigDict(dict(
      rows=(1,) if dry else (1, 4, 16, 64),
      priced=(1,) if dry else (1, 4),  # the row counts `costs` prices for the cells' predictions
      arms=(("eagle", 2, 0), ("tree", 2, 2, 3)) if dry else (
          ("eagle", 3, 0), ("tree", 6, 4, 16), ("tree", 8, 4, 32)),
      # (temperature, rows) in order of value: sampled from few rows first
      order=((0.9, 1), (0.0, 1)) if dry else (
          (0.9, 1), (0.9, 4), (0.0, 1), (0.0, 4), (0.9, 16), (0.0, 16), (0.9, 64), (0.0, 64)),
      repeats=1 if dry else 3))
  c.grpo = ml_collections.ConfigDict(dict(
      baseline="tiny_baseline" if dry else "smollm2_baseline",
      tlt="tiny_tlt" if dry else "smollm2_tlt", variant="small" if dry else "",
      # (dotted key, value) set in both runs' configs; the dry run's drafter is the demo's
      overrides=(("train.eval_every", 0), ("train.steps", 1), ("drafter.init_from", "demo"),
                 ("spec.arms", (("eagle", 3, 0), ("plain", 1, 0))),
                 ("train.prompts_per_step", 2), ("train.group_size", 2),  # 4 rows, one bucket
                 ("rollout.engine.batch_buckets", (4,)), ("rollout.engine.max_batch", 4))
      if dry else (("train.eval_every", 0), ("model.compute_dtype", "bfloat16"))))
  c.large = ml_collections.ConfigDict(dict(
      shape=base.TOY_SHAPE if dry else "qwen2p5_1p5b",
      compute_dtype="float32" if dry else "bfloat16",
      batches=(1,) if dry else (1, 8), tokens=(1, 4), cache_len=64 if dry else 1024,
      iters=2 if dry else 10, rounds=1 if dry else 2,
      rows=4 if dry else 64, group_size=2 if dry else 8, micro_batches=1 if dry else 4,
      prompt_len=8 if dry else 256, new_tokens=8 if dry else 512))
  return c
