"""The cost of invariant numerics against fast (`experiments.bench_numerics`).

Run:
  python -m experiments.bench_numerics --config=experiments/configs/bench_numerics.py          # tiny
  python -m experiments.bench_numerics --config=experiments/configs/bench_numerics.py:smollm2
Small CPU variant (tests):
  python -m experiments.bench_numerics --config=experiments/configs/bench_numerics.py:small
"""

import ml_collections


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "smollm2", "small"):
    raise ValueError(f"Unknown variant {variant!r}; use '', 'smollm2' or 'small'.")
  c = ml_collections.ConfigDict()
  c.model = "smollm2" if variant == "smollm2" else "tiny"
  c.dtype = "float32"             # the compute dtype of both (bfloat16: ~4x slower on this CPU)
  c.batches = (1, 2, 4, 8, 16, 32, 64)
  c.tokens = (1, 4)               # a decode step, and a chain verify of 3 drafts
  c.cache_len = 320
  c.prefix = 64                   # committed tokens a step attends to (invariant: their blocks)
  c.rounds, c.iters = 24, 4       # tiny's steps of ~1 ms: many rounds against the noise
  # Steps a timed call runs in one program, as the engine runs several a dispatch: a call's
  # launch and wait (~0.1-0.3 ms here) spread over them.
  c.steps_per_call = 8
  # The update's forward and backward over R x L tokens (update_rows=0: not timed).
  c.update_rows, c.update_len = 16, 128
  if variant == "smollm2":
    c.batches, c.cache_len, c.rounds, c.iters, c.steps_per_call = (1, 4, 8, 16, 32), 512, 3, 5, 1
  elif variant == "small":
    c.batches, c.cache_len, c.rounds, c.iters, c.steps_per_call = (1, 2), 64, 1, 2, 2
    c.update_rows, c.update_len = 2, 16
  return c
