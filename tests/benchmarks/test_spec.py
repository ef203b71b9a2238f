"""The SD benchmark's speed figure: a ratio of times where outputs are identical, SD's tokens
priced at plain decoding's per-bucket rate where they are not (the rejection rule)."""

import types

import numpy as np
import pytest

from tlt_jax.rollout.timeline import Timeline
from experiments.benchmarks.spec import sd_speedup


def _rollout(tokens, events):
  """A result with these output tokens and decode events (kind, bucket, live, seconds, tokens)."""
  tl, t = Timeline(1), 0.0
  for kind, bucket, live, seconds, emitted in events:
    tl.record(0, kind, tl.t0 + t, tl.t0 + t + seconds, bucket, live, tokens=emitted)
    t += seconds
  return types.SimpleNamespace(tokens=np.asarray(tokens), timeline=tl)


def test_identical_outputs_give_the_ratio_of_decode_times():
  plain = _rollout([1, 2], [("prefill", 4, 4, 9.0, 0), ("decode", 4, 4, 1.0, 32),
                            ("decode", 2, 2, 5.0, 40)])
  # SD reaches bucket 1 where plain, syncing at other steps, never decoded: still a time ratio.
  sd = _rollout([1, 2], [("decode", 4, 4, 1.0, 32), ("compact", 1, 1, 5.0, 0),
                         ("spec:eagle_d3", 2, 2, 1.0, 30), ("spec:eagle_d3", 1, 1, 2.0, 10)])
  assert sd_speedup(plain, sd) == pytest.approx(6.0 / 4.0)
  assert sd_speedup(plain, sd, lambda e: e.live <= 2) == pytest.approx(5.0 / 3.0)
  # Plain spent no time at bucket 1 (its last two rows ended in one dispatch): no ratio there.
  assert sd_speedup(plain, sd, lambda e: e.bucket == 1) is None


def test_different_outputs_are_priced_at_plain_rates_per_bucket():
  plain = _rollout([1, 2], [("decode", 2, 2, 2.0, 16), ("decode", 1, 1, 3.0, 24)])
  # Longer responses at plain's own rate per bucket (8 and 8 tokens/s): no speedup.
  sd = _rollout([1, 3], [("spec:suffix_d3", 2, 2, 4.0, 32), ("spec:suffix_d3", 1, 1, 1.0, 8)])
  assert sd_speedup(plain, sd) == pytest.approx(1.0)
  # Twice plain's rate at bucket 1 only: 5 s of plain work in 4.5 s.
  sd = _rollout([1, 3], [("spec:suffix_d3", 2, 2, 4.0, 32), ("spec:suffix_d3", 1, 1, 0.5, 8)])
  assert sd_speedup(plain, sd) == pytest.approx(5.0 / 4.5)
  # Rates come from all of plain's events at a bucket, whatever `keep` selects of SD's.
  assert sd_speedup(plain, sd, lambda e: e.bucket == 1) == pytest.approx(2.0)
  # No plain rate at bucket 4: no figure rather than a guessed one.
  sd = _rollout([1, 3], [("spec:suffix_d3", 4, 3, 1.0, 10)])
  assert sd_speedup(plain, sd) is None
