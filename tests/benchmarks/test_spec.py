"""The SD benchmark's speed figure: a ratio of times where outputs are identical, SD's tokens
priced at plain decoding's per-bucket rate where they are not (the rejection rule), and the
fixed-length arm sweep where both emit the same tokens."""

import types

import jax
import numpy as np
import pytest

from experiments.benchmarks.spec import arm_sweep, sd_speedup
from tests.conftest import small_config
from tlt_jax.drafter.model import DrafterConfig, init_drafter
from tlt_jax.models import init_model
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rollout.engine import EngineConfig
from tlt_jax.rollout.timeline import Timeline
from tlt_jax.spec.strategy import SpecConfig, Strategy


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


@pytest.mark.slow  # a benchmark's sweep: two engines per arm, timed twice
@pytest.mark.parametrize("rule", ["coupled", "rejection"])
def test_the_fixed_length_sweep_emits_the_same_tokens_under_either_rule(rule):
  """With `ignore_eos` every row decodes exactly max_new_tokens, plain or speculative under
  either rule, so a speedup is a plain ratio of decode times; each cell has its spread, its
  prediction from the costs measured in the same run and the step's parts."""
  target = init_model(small_config(), seed=0)
  drafter = init_drafter(target.cfg, DrafterConfig(), seed=1)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(3, 53, size=6).tolist() for _ in range(2)]
  params = SamplingParams(temperature=0.9, max_new_tokens=12, stop_tokens=(3, 4, 5))
  cfg = EngineConfig(batch_buckets=(1, 2), max_batch=2, steps_per_dispatch=2, precompile=False)
  spec = SpecConfig(threshold=2, rule=rule,
                    arms=(Strategy("eagle", 3, 0), Strategy("suffix", 2, 2)))
  rows = arm_sweep(target, prompts, (2,), params, cfg, spec, jax.random.key(0), repeats=2,
                   drafter=drafter, ignore_eos=True)
  assert [(r["rows"], r["arm"]) for r in rows] == [(2, "eagle_d3"), (2, "suffix_d2_n2")]
  for r in rows:
    assert r["plain_tokens"] == r["sd_tokens"] == 12 * r["rows"]
    assert r["speedup_min"] <= r["speedup"] <= r["speedup_max"]
    # Two rounds: the median seconds are their means, so the ratio of the medians is the
    # mediant of the rounds' ratios and lies between them however the machine's speed swings
    # (the slack is the figures' rounding to 3 and 4 decimals).
    assert (0.99 * r["speedup_min"] - 1e-3 <= r["plain_s"] / r["sd_s"]
            <= 1.01 * r["speedup_max"] + 1e-3)
    assert r["predicted"] > 0 and 1.0 <= r["accept_len_to_eos"] and 1.0 <= r["accept_len"]
    assert r["verify_ms"] > 0 and r["sd_step_ms"] > 0 and r["c1_ms"] > 0
    assert (r["draft_ms"] > 0) == (r["arm"] == "eagle_d3")
    if rule == "coupled":
      assert r["identical"]
