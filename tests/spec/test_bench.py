"""The speed figure of the SD benchmark prices SD's tokens at plain decoding's rate per bucket."""

import pytest

from tlt_jax.rollout.timeline import Timeline
from tlt_jax.spec.bench import plain_equivalent_speedup


def _timeline(events):
  """events: (kind, bucket, live, seconds, tokens), back to back."""
  tl, t = Timeline(1), 0.0
  for kind, bucket, live, seconds, tokens in events:
    tl.record(0, kind, tl.t0 + t, tl.t0 + t + seconds, bucket, live, tokens=tokens)
    t += seconds
  return tl


def test_identical_outputs_give_the_ratio_of_wall_times():
  plain = _timeline([("decode", 4, 4, 1.0, 32), ("decode", 2, 2, 2.0, 16),
                     ("decode", 1, 1, 3.0, 24)])
  sd = _timeline([("decode", 4, 4, 1.0, 32), ("spec:eagle_d3", 2, 2, 1.0, 16),
                  ("spec:eagle_d3", 1, 1, 2.0, 24)])
  assert plain_equivalent_speedup(plain, sd) == pytest.approx(6.0 / 4.0)
  in_phase = lambda e: e.live <= 2
  assert plain_equivalent_speedup(plain, sd, in_phase) == pytest.approx(5.0 / 3.0)


def test_different_lengths_at_plain_rates_are_no_speedup():
  # A rejection-rule rollout emits other (here longer) responses: same rate per bucket, more time.
  plain = _timeline([("decode", 2, 2, 2.0, 16), ("decode", 1, 1, 3.0, 24)])
  sd = _timeline([("spec:suffix_d3", 2, 2, 4.0, 32), ("spec:suffix_d3", 1, 1, 1.0, 8)])
  assert plain_equivalent_speedup(plain, sd) == pytest.approx(1.0)
  # Twice plain's rate at bucket 1 only: 1 s of plain work done in 0.5 s, bucket 2 unchanged.
  sd = _timeline([("spec:suffix_d3", 2, 2, 4.0, 32), ("spec:suffix_d3", 1, 1, 0.5, 8)])
  assert plain_equivalent_speedup(plain, sd) == pytest.approx(5.0 / 4.5)


def test_compaction_and_prefill_are_not_decode_time_and_unknown_buckets_give_none():
  plain = _timeline([("prefill", 4, 4, 9.0, 0), ("decode", 1, 1, 2.0, 10)])
  sd = _timeline([("prefill", 4, 4, 1.0, 0), ("compact", 1, 1, 5.0, 0),
                  ("spec:eagle_d3", 1, 1, 1.0, 10)])
  assert plain_equivalent_speedup(plain, sd) == pytest.approx(2.0)
  sd = _timeline([("spec:eagle_d3", 2, 2, 1.0, 10)])
  assert plain_equivalent_speedup(plain, sd) is None
