"""Prompt-addressed noise, the history store and the replay arm: replay changes how many forwards
a response takes, never its tokens."""

import jax
import numpy as np
import pytest
from flax import nnx

from tests.conftest import small_config
from tlt_jax.models import init_model
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rollout import compiles
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.rollout.history import HistoryConfig, ReplayConfig, StoredResponses
from tlt_jax.rollout.noise import PROMPT_WORDS, PromptNoise, prompt_id
from tlt_jax.rollout.replay_choice import ReplayChoice
from tlt_jax.spec.costs import CostTable
from tlt_jax.spec.strategy import SpecConfig, Strategy

STOPS = (7, 9, 11)
CHUNK = 6


def _prompts(n=4, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(3, 53, size=int(rng.integers(2, 10))).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def model():
  return init_model(small_config(), seed=0)


def _moved(model, scale: float):
  """The model after an update: every weight moved by `scale` times its spread."""
  graphdef, state = nnx.split(model)
  keys = iter(jax.random.split(jax.random.key(7), len(jax.tree.leaves(state))))
  state = jax.tree.map(lambda x: x + scale * x.std() * jax.random.normal(next(keys), x.shape),
                       state)
  return nnx.merge(graphdef, state)


def _engine(model, replay_chunk=CHUNK, spec=None, costs=None, dispatch="cost", **kw):
  cfg = EngineConfig(**dict(dict(batch_buckets=(2, 8), max_batch=8, steps_per_dispatch=3,
                                 precompile=False), **kw))
  replay = ReplayConfig("prompt", history=HistoryConfig(
      max_tokens=10_000 if replay_chunk else 0, chunk=replay_chunk, dispatch=dispatch))
  return RolloutEngine(model, cfg, spec=spec, costs=costs, replay=replay)


def test_prompt_noise_addresses():
  prompts = [[5, 6, 7], [8, 9], [5, 6, 7]]  # a duplicate within the step
  noise = PromptNoise(refresh=2)
  a = noise.addresses(prompts, 2).view(np.uint32)
  assert a.shape == (6, PROMPT_WORDS)
  assert tuple(a[0, :2]) == prompt_id([5, 6, 7]) != prompt_id([5, 6, 8])
  assert a[0, 3] == 0 and a[4, 3] == 1  # the duplicate is its second occurrence
  assert len({tuple(r) for r in a}) == 6  # every row its own noise
  top_up = noise.addresses([[8, 9]], 2).view(np.uint32)  # a top-up round of the same step
  assert top_up[0, 3] == 1
  noise.end_step()
  again = noise.addresses(prompts, 2).view(np.uint32)
  np.testing.assert_array_equal(again, a)  # the next step: the same noise (epoch 0 still)
  noise.end_step()
  third = noise.addresses(prompts, 2).view(np.uint32)
  assert (third[:, 2] == 1).all()  # 2 visits with refresh 2: a new epoch
  restored = PromptNoise(refresh=2)
  restored.load_state(noise.state())
  assert restored.visits == noise.visits


def test_history_store_bounds_epochs_and_round_trips():
  noise = PromptNoise()
  addr = noise.addresses([[1, 2], [3, 4]], 2)
  h = StoredResponses(max_tokens=9)
  h.store(addr, [[1, 2, 3], [4, 5], [6], [7, 8, 9]])
  assert h.total == 9 and [None if r is None else r.tolist() for r in h.lookup(addr)] == [
      [1, 2, 3], [4, 5], [6], [7, 8, 9]]
  assert h.corpus(addr, 2) == {0: [1, 2, 3, 4, 5], 1: [6, 7, 8, 9]}
  h.store(addr[:1], [[1, 1]])  # row 0 visited again: now the newest, its old response replaced
  h.store(addr[1:2], [[2] * 5])  # 11 tokens, over the bound: the oldest (rows 2, 3) go
  assert [None if r is None else r.tolist() for r in h.lookup(addr)] == [
      [1, 1], [2] * 5, None, None] and h.total == 7
  other = addr.view(np.uint32).copy()
  other[:, 2] += 1  # another noise epoch: nothing to replay
  assert h.lookup(other.view(np.int32)) == [None] * 4
  restored = StoredResponses(9)
  restored.load_state(h.state())
  assert [None if r is None else r.tolist() for r in restored.lookup(addr)] == [
      None if r is None else r.tolist() for r in h.lookup(addr)]
  assert restored.total == h.total


# The random test model's greedy choices have wide margins: it takes a larger move to change them.
@pytest.mark.parametrize("temperature,scale", [(0.0, 2.0), (1.0, 0.6)])
def test_replay_gives_the_tokens_of_decoding_afresh(model, temperature, scale):
  """A stored response replays completely under the policy that drew it, and partly after an
  update; either way every token equals replay-off decoding under the same noise, including
  stop tokens and max_new_tokens inside a chunk."""
  moved = _moved(model, scale)
  prompts, g = _prompts(), 2
  params = SamplingParams(temperature=temperature, max_new_tokens=20, stop_tokens=STOPS)
  addr = PromptNoise().addresses(prompts, g)
  key = jax.random.key(3)
  first = _engine(model).generate(prompts, g, params, key, addresses=addr)
  stored = [first.response(i) for i in range(len(first.lengths))]
  assert len(set(first.lengths.tolist())) > 1 and "stop" in first.stop_reasons
  same = _engine(model).generate(prompts, g, params, key, addresses=addr, replay=stored)
  np.testing.assert_array_equal(same.tokens, first.tokens)
  assert same.timeline.summary()["replay_fraction"] == 1.0
  fresh = _engine(moved, replay_chunk=0).generate(prompts, g, params, key, addresses=addr)
  replayed = _engine(moved).generate(prompts, g, params, key, addresses=addr, replay=stored)
  np.testing.assert_array_equal(replayed.tokens, fresh.tokens)
  np.testing.assert_array_equal(replayed.lengths, fresh.lengths)
  np.testing.assert_allclose(replayed.logprobs, fresh.logprobs, atol=1e-5)  # verify vs step
  assert not np.array_equal(fresh.tokens, first.tokens)  # the update changed some responses
  assert 0.0 < replayed.timeline.summary()["replay_fraction"] < 1.0


def test_without_addresses_an_engine_under_prompt_noise_samples_as_one_under_step_noise(model):
  """A held-out evaluation passes no addresses: its rows' sample ids padded to the prompt
  address width are the noise of the ids alone, so the same policy gives the same samples under
  either noise mode."""
  prompts, g = _prompts(3, seed=4), 2
  params = SamplingParams(temperature=1.0, max_new_tokens=12, stop_tokens=STOPS)
  prompt_noise = _engine(model, replay_chunk=0).generate(prompts, g, params, jax.random.key(9))
  step = RolloutEngine(model, EngineConfig(batch_buckets=(2, 8), max_batch=8,
                                           steps_per_dispatch=3, precompile=False))
  np.testing.assert_array_equal(
      prompt_noise.tokens, step.generate(prompts, g, params, jax.random.key(9)).tokens)


def test_replay_beside_speculation_and_without_compiles(model):
  """With a coupled suffix arm: replay then speculation, the tokens of plain decoding; after a
  warm-up nothing compiles."""
  prompts, g = _prompts(3, seed=2), 2
  params = SamplingParams(temperature=1.0, max_new_tokens=16, stop_tokens=STOPS)
  addr = PromptNoise().addresses(prompts, g)
  key = jax.random.key(4)
  plain = _engine(model, replay_chunk=0).generate(prompts, g, params, key, addresses=addr)
  stored = [plain.response(i)[: max(plain.lengths[i] // 2, 1)] for i in range(len(addr))]
  spec = SpecConfig(arms=(Strategy("suffix", 3, 2),), threshold=8)
  # Two batch buckets (6 rows compact from 8 to 2): the warm-up builds half the programs.
  eng = _engine(model, spec=spec, max_prompt_len=16, batch_buckets=(2, 8))
  eng.warm_up([(len(prompts), g)], params, [len(p) for p in prompts])
  built = compiles.Since()
  res = eng.generate(prompts, g, params, key, addresses=addr, replay=stored)
  assert built.events == 0
  np.testing.assert_array_equal(res.tokens, plain.tokens)
  kinds = {e.kind for e in res.timeline.events}
  assert "replay" in kinds and "spec:suffix_d3_n2" in kinds, kinds


def test_replay_choice_prices_a_dispatch_by_the_cost_table_and_the_running_acceptance():
  """Replay where (live - replaying + replaying * accept) / c(B, 1 + chunk) beats
  live / c(B, 1); by the share of rows replaying where the table lacks the bucket."""
  table = CostTable({(8, 1): 1.0, (8, 1 + CHUNK): 3.0})
  choice = ReplayChoice(CHUNK, table)
  assert choice.accept == CHUNK + 1  # before any replay dispatch: optimistic, so it measures
  assert choice.replays(8, 8, 8)  # 8 * 7 tokens for 3 steps' time against 8 * 3
  assert choice.replays(8, 8, 4)  # (4 + 28) / 3 > 8
  assert not choice.replays(8, 8, 2)  # (6 + 14) / 3 < 8
  assert not choice.replays(8, 8, 0)
  assert choice.speedup(8, 8, 4) == pytest.approx(32 / 24)
  choice.record(tokens=40, rows=4, steps=2)  # the first measurement replaces the prior
  assert choice.accept == 5.0
  assert choice.replays(8, 8, 8) and not choice.replays(8, 8, 4)  # 5 / 3 > 1 > 20 / 24
  choice.record(tokens=16, rows=4, steps=2)  # then a running mean
  assert choice.accept == pytest.approx(5 + 0.3 * (2 - 5))
  for _ in range(20):
    choice.record(tokens=24, rows=8, steps=2)  # 1.5: no longer pays at 3 decode steps a verify
  assert not choice.replays(8, 8, 8)
  unpriced = ReplayChoice(CHUNK, CostTable({(8, 1): 1.0}))  # no verify cell: by the share
  assert unpriced.speedup(8, 8, 4) is None
  assert unpriced.replays(8, 8, 4) and not unpriced.replays(8, 8, 3)
  assert ReplayChoice(CHUNK).replays(2, 2, 1)


def test_a_replay_declined_where_the_verify_is_dear_is_taken_where_it_is_cheap(model):
  """Priced at 20 decode steps a verify at 8 rows and 1 at 2 rows, the engine decodes its 8-row
  dispatches and replays its 2-row ones, and the rows that decoded meanwhile still replay
  (their tokens equalled the stored ones); the tokens are those of replay off either way."""
  prompts, g = _prompts(4, seed=5), 2
  params = SamplingParams(temperature=1.0, max_new_tokens=20, stop_tokens=STOPS)
  addr = PromptNoise().addresses(prompts, g)
  key = jax.random.key(6)
  first = _engine(model, replay_chunk=0).generate(prompts, g, params, key, addresses=addr)
  stored = [first.response(i) for i in range(len(first.lengths))]
  table = CostTable({(8, 1): 1.0, (8, 1 + CHUNK): 20.0, (2, 1): 1.0, (2, 1 + CHUNK): 1.0})
  res = _engine(model, costs=table).generate(prompts, g, params, key, addresses=addr,
                                             replay=stored)
  np.testing.assert_array_equal(res.tokens, first.tokens)
  runs = {(e.kind, e.bucket) for e in res.timeline.events if e.kind in ("decode", "replay")}
  assert ("decode", 8) in runs and ("replay", 2) in runs and ("replay", 8) not in runs, runs
  assert res.timeline.summary()["replay_fraction"] > 0.0
  dear = CostTable({(b, t): 1.0 if t == 1 else 20.0 for b in (2, 8) for t in (1, 1 + CHUNK)})
  plain = _engine(model, costs=dear).generate(prompts, g, params, key, addresses=addr,
                                              replay=stored)
  assert {e.kind for e in plain.timeline.events} & {"replay"} == set()
  np.testing.assert_array_equal(plain.tokens, first.tokens)
  # `rollout.history.dispatch = "share"`: by the share of rows replaying, whatever the table says.
  shared = _engine(model, costs=dear, dispatch="share").generate(prompts, g, params, key,
                                                                 addresses=addr, replay=stored)
  assert ("replay", 8) in {(e.kind, e.bucket) for e in shared.timeline.events}
  np.testing.assert_array_equal(shared.tokens, first.tokens)
  with pytest.raises(ValueError, match="history.dispatch must be one of"):
    HistoryConfig(max_tokens=10, chunk=4, dispatch="bandit")


def test_replay_needs_coupled_and_prompt_addresses(model):
  with pytest.raises(ValueError, match="'coupled' rule only"):
    _engine(model, spec=SpecConfig(arms=(Strategy("suffix", 3, 2),), rule="rejection"))
  eng = _engine(model)
  with pytest.raises(ValueError, match="addresses must be"):
    eng.generate([[3, 4]], 2, SamplingParams(max_new_tokens=4), jax.random.key(0),
                 addresses=np.zeros((2, 1), np.int32))
