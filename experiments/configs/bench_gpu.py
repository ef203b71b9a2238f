"""The GPU benchmark: c(B, T), the batch-1 step against the weight-read floor, the engine's rollout
and speculative decoding, on random-initialised models of SmolLM2-135M's and Qwen2.5-1.5B's shapes
(no model file needs to travel) in bf16 with the Pallas attention path; SD acceptance on the real
SmolLM2 where it is present, with `smollm2_drafter` (e.g. `smollm2`, the shipped one).

Run on a GPU box (with a network `make bench-gpu` installs the `gpu` extra first):
  make bench-gpu
  python -m experiments.bench_gpu --config=experiments/configs/bench_gpu.py
Small variant (the tests'; on CPU the kernel is interpreted, so its times are not speed figures):
  python -m experiments.bench_gpu --config=experiments/configs/bench_gpu.py:small
"""

import ml_collections

from experiments.configs import base

def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "small"):
    raise ValueError(f"Unknown variant {variant!r}; use '' or 'small'.")
  small = variant == "small"
  c = ml_collections.ConfigDict()
  c.out_dir = "runs/bench_gpu"
  c.require_gpu = not small     # without a GPU the command stops at once, with a message
  c.dtype = "bfloat16"          # weights, compute and cache
  c.attention = "pallas"
  # name -> a `SHAPES` name or ModelConfig fields (weights are random)
  c.shapes = {"tiny": base.TOY_SHAPE} if small else {"smollm2_135m": "smollm2_135m",
                                           "qwen2_5_1_5b": "qwen2p5_1p5b"}
  c.batches = (1,) if small else (1, 2, 4, 8)
  c.tokens = (1, 4) if small else (1, 4, 8)  # T = 4: a chain of 3 drafts and the bonus token
  c.cache_len = 64 if small else 1024
  c.iters = 2 if small else 20
  c.rounds = 1 if small else 3
  c.rollout = dict(rows=(2,) if small else (1, 8), prompt_len=16 if small else 128,
                   new_tokens=8 if small else 256)
  c.spec = dict(depth=3, rows=2 if small else 8, repeats=1 if small else 3)
  c.smollm2_drafter = ""        # a SmolLM2 drafter (shipped name or directory): its acceptance
  c.smollm2 = base.smollm2_workload()  # bf16 compute over float32 master weights
  c.smollm2.model.compute_dtype = c.dtype
  c.smollm2.num_prompts = 8
  c.smollm2.group_size = 4
  return c
