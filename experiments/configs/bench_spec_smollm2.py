"""Speculative-decoding benchmark on SmolLM2-135M-Instruct with the word problems, temperature 0.9
as in TLT, with the cached warm-up drafter of `drafter_smollm2.py` (trained first if missing).
Thresholds and arms follow the measured c(B, T) in docs/BENCHMARKS.md: at batch 1 a verify of
4-8 tokens costs 1.2-1.45x a decode step and a draft step with the restricted head ~0.1x; at
batch 4 a verify of 4-8 tokens costs 1.5-2.1x, more than the accepted length at T = 0.9 repays.

The bandit's arms are the EAGLE chain of 3, the suffix chain of 3 and plain decoding: in the
arm sweep (run alone, from 1, 2 and 4 live rows) both chains beat plain and every tree lost
(0.60-0.91x), so trees only appear in the sweep; a bandit exploring arms that always lose spends
the short SD phase on them.

Run (the `rejection` variant speculates with the rejection rule instead of `coupled`; its outputs
differ from plain sampling's, so its speedups price SD's tokens at plain decoding's measured rate
per batch bucket, see `spec.bench.sd_speedup`):
  python -m experiments.bench_spec --config=experiments/configs/bench_spec_smollm2.py
  python -m experiments.bench_spec --config=experiments/configs/bench_spec_smollm2.py:rejection
The `unrolled` variant uses the drafter of `drafter_smollm2.py:unrolled`:
  python -m experiments.bench_spec --config=experiments/configs/bench_spec_smollm2.py:unrolled
"""

import ml_collections

from experiments.configs import drafter_smollm2


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  c = drafter_smollm2.get_config({"small": "small", "unrolled": "unrolled"}.get(variant, ""))
  c.spec = ml_collections.ConfigDict(dict(
      threshold=2, rule="coupled", epsilon=0.1, window=300, min_accept_len=1.05,
      health_window=64, seed=0,
      # (proposer, depth, ngram) chains; ('tree', depth, topk, nodes) EAGLE-2 trees
      arms=(("eagle", 3, 0), ("suffix", 3, 3), ("plain", 1, 0))))
  c.repeats = 2
  c.sweep_rows = (1, 2, 4)  # each arm alone from these live batches: speedup against batch size
  c.sweep_arms = (("eagle", 3, 0), ("tree", 3, 2, 4), ("tree", 4, 3, 8), ("suffix", 3, 3))
  if variant == "rejection":
    c.spec.rule = "rejection"
  elif variant not in ("", "small", "unrolled"):
    raise ValueError(f"Unknown variant {variant!r}; use '', 'small', 'rejection' or 'unrolled'.")
  return c
