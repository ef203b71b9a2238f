"""The cost model of a speculative step and the `cost` chooser: predictions from a given table,
the arm that table and the acceptances imply, plain when nothing pays, exploration only while
an arm's acceptance is uncertain; measured tables round-trip and are cached per machine; the
engine decodes exactly under the chooser."""

import types

import jax
import numpy as np
import pytest

from tests.conftest import small_config
from tlt_jax.drafter import costs as costs_lib
from tlt_jax.drafter.costs import (alternating_times, call_overhead, cost_table_for, needed_cells,
                                   step_runner)
from tlt_jax.drafter.model import DrafterConfig, init_drafter
from tlt_jax.models import init_model
from tlt_jax.models.sampling import SamplingParams, processed_logprobs
from tlt_jax.rl import metrics
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.spec.controller import SpecController
from tlt_jax.spec.cost_chooser import CostChooser
from tlt_jax.spec.costs import CostTable
from tlt_jax.spec.strategy import SpecConfig, Strategy
from tlt_jax.spec.verify import coupled_targets

EAGLE3, SUFFIX3, PLAIN = Strategy("eagle", 3, 0), Strategy("suffix", 3, 3), Strategy("plain", 1, 0)
# c(B, 1) = 10 ms, a verify of 4 tokens 15 ms at B = 1 and 20 ms at B = 2; a draft step 1 ms,
# the drafter reading 3 kept tokens 2 ms.
TABLE = CostTable({(1, 1): 0.010, (1, 4): 0.015, (2, 1): 0.010, (2, 4): 0.020},
                  {(1, 1): 0.001, (1, 3): 0.002, (2, 1): 0.001, (2, 3): 0.002})


def test_the_prediction_is_accepted_tokens_over_the_step_in_decode_steps():
  assert TABLE.step_terms(EAGLE3, 1, "coupled") == {"verify": 0.015, "draft": 0.003,
                                                    "follow": 0.002}
  assert TABLE.speedup(EAGLE3, 1, 3.0, "coupled") == pytest.approx(3.0 * 10 / 20)
  assert TABLE.speedup(SUFFIX3, 1, 2.0, "coupled") == pytest.approx(2.0 * 10 / 15)  # no drafter
  assert TABLE.speedup(EAGLE3, 2, 2.0, "coupled") == pytest.approx(2.0 * 10 / 25)
  assert TABLE.speedup(EAGLE3, 3, 2.0, "coupled") is None  # no batch >= 3 was measured
  assert CostTable.from_json(TABLE.to_json()) == TABLE


def _observe(ch, arm, accept, dispatches=20, rows=20, spread=0.2):
  """`dispatches` dispatches of `rows` row-steps at `accept` +- `spread` tokens per step."""
  for i in range(dispatches):
    ch.observe(arm, round((accept + (spread if i % 2 else -spread)) * rows), rows)


def _chooser(accepts):
  """A chooser over (eagle_d3, suffix_d3, plain) after 400 row-steps at these acceptances."""
  ch = CostChooser((EAGLE3, SUFFIX3, PLAIN), TABLE, "coupled")
  for a, acc in enumerate(accepts):
    _observe(ch, a, acc)
  return ch


def test_the_chooser_picks_the_arm_the_table_and_acceptances_imply():
  # eagle at 3.0: 1.5x at B = 1, 1.2x at B = 2; suffix at 1.8: 1.2x at B = 1, 0.9x at B = 2.
  ch = _chooser([3.0, 1.8])
  assert ch.choose(1, [0, 1, 2]) == 0 and ch.choose(2, [0, 1, 2]) == 0
  assert ch.choose(1, [1, 2]) == 1     # with eagle retired, suffix still pays at B = 1
  assert ch.choose(2, [1, 2]) == 2     # but not at B = 2: plain
  # Neither pays anywhere once their acceptance is known: plain.
  ch = _chooser([1.6, 1.2])
  assert ch.choose(1, [0, 1, 2]) == 2 and ch.choose(2, [0, 1, 2]) == 2
  assert ch.best(1, [0, 1, 2]) == 2


def test_an_untried_or_uncertain_arm_is_explored_only_while_it_might_pay():
  ch = _chooser([])
  assert ch.choose(1, [0, 1, 2]) in (0, 1)  # untried: priced at its most tokens per step
  # An arm whose every draft is accepted could pay 4 x 10 / 15 at B = 1: it is tried once
  # its rival is known to lose.
  ch = CostChooser((SUFFIX3, PLAIN), TABLE, "coupled")
  assert ch.choose(2, [0, 1]) == 0
  ch.observe(0, 12, 10)  # 1.2 tokens per step in one dispatch: still uncertain, still tried
  ch.observe(0, 12, 10)
  assert ch.choose(2, [0, 1]) == 0
  _observe(ch, 0, 1.2, spread=0.1)  # over 22 dispatches: known to lose (0.6x at B = 2)
  assert ch.choose(2, [0, 1]) == 1
  # A wide spread keeps it uncertain for longer: at 1.2 +- 1.0 over 4 dispatches, the bound
  # (1.2 + 2 x 0.5) reaches 1.1x at B = 2.
  ch = CostChooser((SUFFIX3, PLAIN), TABLE, "coupled")
  _observe(ch, 0, 1.2, dispatches=4, spread=1.0)
  assert ch.choose(2, [0, 1]) == 0
  # An arm absent from the table is never chosen blind; without a plain arm, None is plain
  # decoding.
  ch = CostChooser((Strategy("eagle", 5, 0), PLAIN), TABLE, "coupled")
  assert ch.choose(1, [0, 1]) == 1
  ch = CostChooser((SUFFIX3,), TABLE, "coupled")
  _observe(ch, 0, 1.2, spread=0.1)
  assert ch.choose(2, [0]) is None and ch.best(2, [0]) is None


def test_the_controller_needs_a_table_for_the_cost_chooser():
  with pytest.raises(ValueError, match="cost table"):
    SpecController(SpecConfig(arms=(SUFFIX3, PLAIN), chooser="cost"), (1, 2))
  with pytest.raises(ValueError, match="chooser"):
    SpecConfig(chooser="fastest")


def test_a_rollout_reports_its_own_accepted_length_and_a_run_the_steps_that_speculated():
  """A rollout's record (`summary(since=counts())`) holds its own dispatches' accepted length,
  0 where it decoded plainly throughout; a run's mean leaves those steps out."""
  ctl = SpecController(SpecConfig(arms=(EAGLE3, SUFFIX3, PLAIN), chooser="bandit"), (1, 2))
  ctl.record(1, 0, tokens=30, row_steps=10, wall_s=1.0, live=1)   # a first rollout: 3.0
  first = ctl.counts()
  assert ctl.summary(since=first)["accept_len"] == 0.0             # a plain rollout after it
  ctl.record(1, 1, tokens=12, row_steps=8, wall_s=1.0, live=1)    # a third: 1.5
  third = ctl.summary(since=first)
  assert third["accept_len"] == 1.5 and third["accept_len_per_arm"] == {"suffix_d3_n3": 1.5}
  assert ctl.summary()["accept_len"] == round(42 / 18, 3)          # the whole run's dispatches
  steps = [{"spec/accept_len": 3.0}, {"spec/accept_len": 0.0}, {"spec/accept_len": 1.5}]
  assert metrics.accept_len(steps) == 2.25 and metrics.accept_len(steps[1:2]) == 0.0


def test_needed_cells_and_the_per_machine_cache(tmp_path, monkeypatch):
  target = init_model(small_config(), seed=0)
  drafter = init_drafter(target.cfg, DrafterConfig(), seed=1)
  spec = SpecConfig(threshold=2, arms=(EAGLE3, SUFFIX3, PLAIN), chooser="cost")
  t_cells, d_cells = needed_cells(spec, (1, 2, 4, 8))
  assert t_cells == {(1, 1), (1, 4), (2, 1), (2, 4)} and d_cells == {(1, 1), (1, 3), (2, 1),
                                                                     (2, 3)}
  table, loaded = cost_table_for(target, drafter, spec, (1, 2, 4, 8), 64, str(tmp_path))
  assert not loaded and set(table.target_s) == t_cells and set(table.draft_s) == d_cells
  assert all(s > 0 for s in [*table.target_s.values(), *table.draft_s.values()])
  again, loaded = cost_table_for(target, drafter, spec, (1, 2, 4, 8), 64, str(tmp_path))
  assert loaded and again == table
  # A cache directory kept across machines: another processor measures its own table.
  monkeypatch.setattr(costs_lib, "cpu_model", lambda: "another processor")
  assert not cost_table_for(target, drafter, spec, (1, 2, 4, 8), 64, str(tmp_path))[1]
  monkeypatch.undo()
  # Replay's cells (`rollout/replay_choice.py`): a decode and a verify of 1 + chunk at every
  # bucket, beside the spec's or alone.
  assert needed_cells(None, (1, 2), replay_chunk=8) == ({(1, 1), (1, 9), (2, 1), (2, 9)}, set())
  assert needed_cells(spec, (1, 2, 4), replay_chunk=8)[0] == t_cells | {
      (b, t) for b in (1, 2, 4) for t in (1, 9)}
  replay, loaded = cost_table_for(target, None, None, (1, 2), 64, str(tmp_path), replay_chunk=8)
  assert not loaded and set(replay.target_s) == {(1, 1), (1, 9), (2, 1), (2, 9)}


def test_a_priced_step_samples_every_position_as_the_engine_does():
  """The cost table times each step with its sampling: the draw from the processed
  distribution under each position's addressed noise (`spec.verify.coupled_targets`)."""
  model = init_model(small_config(), seed=0)
  params = SamplingParams(temperature=0.9)
  logits = step_runner(model, 2, 5, 64)()
  tokens = step_runner(model, 2, 5, 64, params=params)()
  expected = coupled_targets(processed_logprobs(logits, params), jax.random.key(0),
                             np.arange(2), 64 + np.tile(np.arange(5), (2, 1)), False)
  assert tokens.shape == (2, 5)
  np.testing.assert_array_equal(tokens, expected)
  # Three steps in one call run the same step three times (the cache's lengths reset each time).
  np.testing.assert_array_equal(step_runner(model, 2, 5, 64, params=params)(3), expected)


def test_a_step_s_cost_is_what_it_adds_to_a_call_not_the_call_s_own_overhead(monkeypatch):
  """A call of n steps that costs 40 ms plus 10 ms a step costs 40 ms beyond its step: the
  engine launches several steps a program, so a call's own launch and wait is not a step's. The
  calls run on a clock of their own (a wall clock's sleeps overshoot on a busy machine), some of
  them late, as a shared machine makes them: the fastest call of each is what counts."""
  clock, late = [0.0], iter([0.0, 0.003, 0.0, 0.02] * 6)
  monkeypatch.setattr(costs_lib, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

  def run(n=1):
    clock[0] += 0.04 + 0.01 * n + next(late)
  times = alternating_times({"one": run, "dispatch": lambda: run(8)}, rounds=2, iters=2)
  assert times["one"].max() > times["one"].min() + 0.002  # the late calls were timed
  assert call_overhead(times["one"].min(), times["dispatch"].min()) == pytest.approx(0.04)
  assert call_overhead(0.01, 0.09) == 0.0  # a step dearer than the call: no overhead, never < 0


def test_the_engine_decodes_exactly_under_the_cost_chooser():
  """Whatever the chooser picks, `coupled` SD is plain sampling token for token; with a table
  where the suffix chain pays it is dispatched, and its prediction is reported beside the
  measured speed."""
  model = init_model(small_config(tie_embeddings=False), seed=0)
  model.lm_head.kernel[...] = model.lm_head.kernel[...] * 3.0  # cycles: suffix drafts match
  params = SamplingParams(temperature=1.0, max_new_tokens=30)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(3, 53, size=int(rng.integers(2, 14))).tolist() for _ in range(4)]
  cfg = EngineConfig(batch_buckets=(1, 2, 4, 8), max_batch=8, steps_per_dispatch=3,
                     precompile=False)
  cheap = CostTable({(b, t): 0.01 for b in (1, 2, 4, 8) for t in (1, 4)})
  spec = SpecConfig(threshold=8, arms=(SUFFIX3, PLAIN), chooser="cost")
  plain = RolloutEngine(model, cfg).generate(prompts, 2, params, jax.random.key(3))
  eng = RolloutEngine(model, cfg, spec=spec, costs=cheap)
  sd = eng.generate(prompts, 2, params, jax.random.key(3))
  np.testing.assert_array_equal(sd.tokens, plain.tokens)
  assert any(e.kind == "spec:suffix_d3_n3" for e in sd.timeline.events)
  report = eng.spec.summary()["predicted_vs_measured"]
  assert report and all(v["predicted"] is not None and v["measured"] > 0 for v in report.values())


def test_dispatches_set_apart_are_reported_apart():
  """The arm's measured speed is the median over dispatches that ran its steps alone; those
  that caught a lazy drafter up or shared the host with compiles are reported beside it."""
  chooser = CostChooser((EAGLE3, PLAIN), TABLE, "coupled")
  chooser.observe(0, 20, 10)  # accepted length 2
  for reward, apart in [(99.0, ""), (10.0, ""), (12.0, ""), (11.0, ""), (2.0, "catch_up"),
                        (5.0, "compiling"), (4.0, "compiling")]:
    chooser.update(1, 0, reward, apart)  # the first (99: it compiled) is never counted
  cell = chooser.predicted_vs_measured()["1/eagle_d3"]
  c1 = TABLE.target(1, 1)
  assert cell == {"predicted": round(chooser.score(1, 0, optimistic=False), 3),
                  "measured": round(11.0 * c1, 3), "dispatches": 3,
                  "measured_catch_up": round(2.0 * c1, 3), "catch_up_dispatches": 1,
                  "measured_compiling": round(5.0 * c1, 3), "compiling_dispatches": 2}
  with pytest.raises(ValueError, match="apart must be"):
    chooser.update(1, 0, 1.0, "slow")
