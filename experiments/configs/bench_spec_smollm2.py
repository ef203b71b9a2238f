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

from experiments.configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "small", "rejection", "unrolled"):
    raise ValueError(f"Unknown variant {variant!r}; use '', 'small', 'rejection' or 'unrolled'.")
  small = variant == "small"
  c = base.smollm2_workload(small)
  c.drafter = base.smollm2_drafter(small, unrolled=variant == "unrolled")  # cached
  c.spec = base.spec((("eagle", 3, 0), ("suffix", 3, 3), ("plain", 1, 0)), threshold=2)
  if variant == "rejection":
    c.spec.rule = "rejection"
  c.bench = ml_collections.ConfigDict(dict(
      num_prompts=2 if small else 8, group_size=2 if small else 4, repeats=2,
      sweep_rows=(1, 2, 4),  # each arm alone from these live batches: speedup against batch size
      sweep_arms=(("eagle", 3, 0), ("tree", 3, 2, 4), ("tree", 4, 3, 8), ("suffix", 3, 3))))
  return c
