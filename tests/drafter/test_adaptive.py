"""The adaptive drafter's pieces: captured hidden states equal a full forward, the data buffer,
spot training that survives preemption, and checked publishing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from tests.conftest import run_on_fake_devices
from tests.drafter.test_drafter import EAGLE, STOPS, _trained_drafter
from tests.rl.test_trainer import engine, workload
from tests.spec.test_spec_engine import _prompts, peaked_model
from tlt_jax.drafter.adaptive import AdaptiveConfig
from tlt_jax.drafter.buffer import BufferConfig, DataBuffer
from tlt_jax.drafter.model import DrafterConfig, init_drafter
from tlt_jax.drafter.proposer import EagleProposer
from tlt_jax.drafter.publish import DrafterPublisher, PublishConfig, chain_accept_len
from tlt_jax.drafter import spot as spot_module
from tlt_jax.drafter.spot import SpotConfig, SpotTrainer, StepRecord
from tlt_jax.drafter.train import DrafterTrainConfig, DrafterTrainer
from tlt_jax.drafter.warmup import load_drafter
from tlt_jax.models.pretrained import load_pretrained
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.models.tokenizer import CharTokenizer
from tlt_jax.rl.grpo import GRPOConfig
from tlt_jax.rl import resume
from tlt_jax.rl.trainer import LoopConfig, Trainer
from tlt_jax.rl.update import OptimConfig
from tlt_jax.rollout import compiles
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.rollout.history import HistoryConfig, ReplayConfig
from tlt_jax.rollout.noise import PromptNoise
from tlt_jax.spec.strategy import SpecConfig, Strategy


def _add(buf, n, step=0, d=4, version=0):
  """A segment of `n` tokens whose hidden states all equal n + 100 * step."""
  return buf.add(np.arange(n, dtype=np.int32), np.full((n, d), n + 100.0 * step, np.float32),
                 version, step)


# ---------------------------------------------------------------- capture


@pytest.fixture(scope="module")
def sd_rollout():
  """A coupled SD rollout at temperature 1 (suffix and EAGLE arms) with hidden-state capture."""
  target = peaked_model()
  drafter = _trained_drafter(target)[0]
  prompts = _prompts(6, seed=4)
  params = SamplingParams(temperature=1.0, max_new_tokens=24, stop_tokens=STOPS)
  spec = SpecConfig(threshold=16, rule="coupled", min_accept_len=0.0,
                    arms=EAGLE + (Strategy(depth=3),))
  eng = RolloutEngine(target, EngineConfig(batch_buckets=(4, 16), max_batch=16,
                                           steps_per_dispatch=3, precompile=False),
                      spec=spec, drafter=EagleProposer(drafter))
  res = eng.generate(prompts, 2, params, jax.random.key(3), capture_hidden=True)
  return target, drafter, prompts, res, eng


def _buffered_hidden_error(target, prompts, group, res) -> float:
  """Buffers a rollout's captured hidden states (device to device) and returns their largest
  distance from one causal forward over each whole sequence, checking every segment's tokens."""
  buf = DataBuffer(BufferConfig(max_tokens=10_000), target.cfg.d_model)
  with jax.transfer_guard_device_to_host("disallow_explicit"):  # device to device only
    added = buf.add_rollout(prompts, group, res, version=3, step=7)
    _, batch_hidden, _ = buf.pack(added, 16, 0)
  assert isinstance(batch_hidden, jax.Array) and batch_hidden.devices() == {buf.device}
  segs = buf.segments()
  assert added == segs and len(segs) == len(prompts) * group
  assert all(s.version == 3 and s.step == 7 for s in segs)
  # One causal forward over every sequence, right-padded: padding leaves earlier positions be.
  fulls = [list(prompts[i // group]) + res.response(i) for i in range(len(segs))]
  width = max(len(f) for f in fulls)
  padded = np.asarray([f + [0] * (width - len(f)) for f in fulls])
  hidden_all = np.asarray(nnx.jit(lambda m, t: m(t).hidden_BxTxD)(target, jnp.asarray(padded)))
  worst = 0.0
  for i, seg in enumerate(segs):
    p, full = prompts[i // group], fulls[i]
    want = hidden_all[i, len(p) - 1:len(full)]
    assert seg.length == len(want) == 1 + int(res.lengths[i])
    np.testing.assert_array_equal(seg.tokens_L, [p[-1]] + res.response(i))
    hidden = buf.hidden(seg)
    assert np.all(np.abs(hidden).sum(-1) > 0)  # none missing or zero
    worst = max(worst, float(np.abs(hidden - np.asarray(want)).max()))
  return worst


def test_every_buffered_hidden_state_equals_a_full_forward(sd_rollout):
  target, _, prompts, res, eng = sd_rollout
  assert res.timeline.summary()["sd_on_fraction"] > 0.5 and eng.spec.accept_len() > 1.2
  assert _buffered_hidden_error(target, prompts, 2, res) < 1e-4


def test_replayed_tokens_buffer_the_hidden_states_of_a_full_forward():
  """Tokens the replay arm commits carry the hidden states of its verify forward, and the tokens
  decoded after a row's stored response those of the decode steps: the adaptive drafter's
  buffer holds a full forward's either way."""
  target = peaked_model()
  prompts = _prompts(4, seed=5)
  params = SamplingParams(temperature=1.0, max_new_tokens=20, stop_tokens=STOPS)
  addresses = PromptNoise().addresses(prompts, 2)
  eng = RolloutEngine(target, EngineConfig(batch_buckets=(2, 8), max_batch=8,
                                           steps_per_dispatch=3, precompile=False),
                      replay=ReplayConfig("prompt",
                                          history=HistoryConfig(max_tokens=10_000, chunk=6)))
  first = eng.generate(prompts, 2, params, jax.random.key(3), addresses=addresses)
  stored = [first.response(i)[:max(int(first.lengths[i]) * 2 // 3, 1)]
            for i in range(len(addresses))]
  res = eng.generate(prompts, 2, params, jax.random.key(3), addresses=addresses, replay=stored,
                     capture_hidden=True)
  np.testing.assert_array_equal(res.tokens, first.tokens)
  assert 0.3 < res.timeline.summary()["replay_fraction"] < 1.0  # replayed, then decoded
  assert _buffered_hidden_error(target, prompts, 2, res) < 1e-4


# ---------------------------------------------------------------- the buffer


def test_buffer_keeps_its_cap_and_evicts_the_oldest_steps_first():
  buf = DataBuffer(BufferConfig(max_tokens=100), d_model=4)
  for step in range(10):
    for n in (8, 12):
      _add(buf, n, step)
      assert buf.tokens <= 100
  assert buf.tokens == sum(s.length for s in buf.segments()) <= 100
  assert [s.step for s in buf.segments()] == [5, 5, 6, 6, 7, 7, 8, 8, 9, 9]  # 20 tokens a step
  assert buf.newest_step == 9 and buf.evicted == 10
  # The ring has wrapped around several times: every kept segment still reads its own rows.
  for s in buf.segments():
    np.testing.assert_array_equal(buf.hidden(s), s.length + 100.0 * s.step)
  assert _add(buf, 1, 10) is None  # too short to hold a training pair: ignored
  assert buf.newest_step == 9
  with pytest.raises(ValueError, match="exceeds the buffer's capacity"):
    _add(buf, 101, 11)


def test_the_buffer_s_checkpoint_reads_its_hidden_states_with_one_program_per_doubling():
  """Each checkpoint holds another count of tokens; its read builds no program until the count
  passes a power of two, and the state round-trips into a fresh buffer."""
  buf = DataBuffer(BufferConfig(max_tokens=100), d_model=4)
  _add(buf, 5, 0)
  _add(buf, 7, 1)
  compiles.install()
  buf.state()  # 12 tokens: reads 16 rows
  _add(buf, 3, 2)
  built = compiles.totals()[0]
  state = buf.state()  # 15 tokens
  assert compiles.totals()[0] == built
  np.testing.assert_array_equal(state["hidden"][:, 0], [5.0] * 5 + [107.0] * 7 + [203.0] * 3)
  restored = DataBuffer(BufferConfig(max_tokens=100), d_model=4)
  restored.load_state(state)
  assert [s.length for s in restored.segments()] == [5, 7, 3]
  for s, r in zip(buf.segments(), restored.segments()):
    np.testing.assert_array_equal(restored.hidden(r), buf.hidden(s))


def test_sampling_favours_long_segments_and_recent_steps():
  buf = DataBuffer(BufferConfig(max_tokens=10_000, length_power=1.0, half_life=2.0), d_model=4)
  _add(buf, 10, step=4)
  _add(buf, 100, step=4)
  _add(buf, 100, step=0)  # two half-lives old: weight 100 / 4 = 25
  np.testing.assert_allclose(buf.weights(), np.array([10, 100, 25]) / 135)
  draws = buf.sample(20_000, np.random.default_rng(0))
  counts = np.array([sum(d is s for d in draws) for s in buf.segments()])
  # Binomial standard deviation <= 0.0035 at n = 20000: a 0.015 tolerance is > 4 sigma.
  np.testing.assert_allclose(counts / 20_000, np.array([10, 100, 25]) / 135, atol=0.015)
  with pytest.raises(ValueError, match="empty"):
    DataBuffer(BufferConfig(), d_model=4).sample(1)


def test_pack_pads_and_windows_long_segments_with_their_own_hidden_states():
  buf = DataBuffer(BufferConfig(max_tokens=16), d_model=4)
  for n in (5, 9, 3):  # the third wraps around the ring's end (rows 14, 15, 0)
    buf.add(np.arange(n, dtype=np.int32) + 10 * n, np.arange(n * 4, dtype=np.float32
                                                            ).reshape(n, 4) + 100 * n, 0, 0)
  segs = buf.segments()
  assert [s.length for s in segs] == [9, 3] and buf.evicted == 1  # 17 tokens > 16: one evicted
  assert buf.pack(segs, seq_len=5, pad_id=0, dtype="bfloat16")[1].dtype == jnp.bfloat16
  toks, hidden, mask = buf.pack(segs, seq_len=5, pad_id=0, rows=3)
  assert toks.shape == (3, 5) and hidden.shape == (3, 5, 4)
  hidden = np.asarray(hidden)
  np.testing.assert_array_equal(mask, [[1] * 5, [1, 1, 1, 0, 0], [0] * 5])
  start = int(toks[0, 0]) - 90  # the random window of the 9-token segment
  np.testing.assert_array_equal(toks[0], 90 + start + np.arange(5))  # a contiguous window
  want = np.arange(36, dtype=np.float32).reshape(9, 4)[start: start + 5] + 900
  np.testing.assert_array_equal(hidden[0], want)
  np.testing.assert_array_equal(hidden[1, :3], np.arange(12).reshape(3, 4) + 300)
  assert not np.any(hidden[1, 3:]) and not np.any(hidden[2])  # padding reads zeros


# ---------------------------------------------------------------- spot training


def _spot(target, buf, seed=5):
  trainer = DrafterTrainer(init_drafter(target.cfg, DrafterConfig(), seed=seed), target,
                           DrafterTrainConfig(lr=3e-3, warmup_steps=2))
  cfg = SpotConfig(batch_rows=8, seq_len=24, min_segments=4, max_steps_per_window=4)
  return SpotTrainer(trainer, buf, cfg, 0)


def test_preempt_and_resume_equals_an_uninterrupted_run(sd_rollout):
  target, _, prompts, res, _ = sd_rollout
  buf = DataBuffer(BufferConfig(max_tokens=10_000), target.cfg.d_model)
  buf.add_rollout(prompts, 2, res, 0, 0)
  straight = _spot(target, buf)
  straight.train_steps(6)
  spot = _spot(target, buf)
  dev = jax.devices()[0]
  assert spot.start(dev) and not spot.start(dev)  # one window at a time
  while len(spot.log) < 2:
    pass
  spot.preempt()  # lands between steps: the window ran 2-4 steps (4 at most)
  done = spot.trainer.step_count
  assert not spot.running and done == len(spot.log) and 2 <= done <= 4
  spot.train_steps(6 - done)  # the next idle window
  assert spot.trainer.step_count == 6
  for a, b in zip(jax.tree.leaves((spot.trainer.params, spot.trainer.opt_state)),
                  jax.tree.leaves((straight.trainer.params, straight.trainer.opt_state))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert straight.log[-1].loss < straight.log[0].loss


def test_a_one_device_budget_is_never_overrun_by_a_step_it_could_see_coming(sd_rollout,
                                                                            monkeypatch):
  """`train_for` takes a step only while one as long as the last ends within the budget (steps
  of 1 s on a fake clock): the run's first step is taken to learn its length, a budget shorter
  than a step then takes none, 3.5 s take 3; `budget_share` adds that share of the rollout's
  seconds."""
  target, _, prompts, res, _ = sd_rollout
  buf = DataBuffer(BufferConfig(max_tokens=10_000), target.cfg.d_model)
  buf.add_rollout(prompts, 2, res, 0, 0)
  spot = _spot(target, buf)
  clock = [0.0]

  def one_step(device):
    del device
    clock[0] += 1.0
    spot.log.append(StepRecord(0, clock[0] - 1.0, clock[0], 0.0, 0.0))

  monkeypatch.setattr(spot_module.time, "perf_counter", lambda: clock[0])
  monkeypatch.setattr(spot, "_one_step", one_step)
  assert spot.train_for(0.5) == 1 and spot.train_for(0.5) == 0
  assert spot.train_for(3.5) == 3 and clock[0] == 4.0
  assert SpotConfig(budget_s=0.5, budget_share=0.1).budget(20.0) == pytest.approx(2.5)
  with pytest.raises(ValueError, match="budget_share"):
    SpotConfig(budget_share=1.5)


def test_idle_windows_on_two_devices_train_replicas_that_merge_into_their_mean():
  out = run_on_fake_devices("tests.drafter.windows_worker", devices=2, timeout=300)
  assert out["steps_per_device"] == [3, 3], out  # each window its own 3 steps
  assert out["step_count"] == 6 and not out["running"]
  assert out["replicas_differ"] and out["merged_exact"], out  # different batches, exact mean


# ---------------------------------------------------------------- publishing


def test_chain_accept_len_closed_form():
  hits = np.array([[True, True, False, True]])
  valid = np.ones_like(hits)
  # runs from each position: 2, 1, 0, 1 -> accepted 3, 2, 1, 2 (depth 4); depth 1 caps at 2.
  assert chain_accept_len(hits, valid, 4) == pytest.approx(2.0)
  assert chain_accept_len(hits, valid, 1) == pytest.approx((2 + 2 + 1 + 2) / 4)


def test_publishing_refuses_nan_and_collapsed_drafters(sd_rollout):
  target, drafter, _, _, eng = sd_rollout
  greedy = SamplingParams(temperature=0.0, max_new_tokens=24)  # the data the drafter fits
  prompts = _prompts(8, seed=9)
  res = eng.generate(prompts, 1, greedy, jax.random.key(0), capture_hidden=True)
  buf = DataBuffer(BufferConfig(max_tokens=10_000), target.cfg.d_model)
  sample = buf.pack(buf.add_rollout(prompts, 1, res, 0, 0), 32, 0)
  pub = DrafterPublisher(eng.drafter_port(), PublishConfig(depth=4, min_ratio=0.8, seq_len=32))
  tparams = nnx.state(target)
  good = nnx.state(drafter, nnx.Param)
  version = eng.weights.drafter_version
  nan = jax.tree.map(lambda x: x * jnp.nan, good)
  assert not pub.publish(nan, tparams, sample, current=good)
  assert pub.events[-1]["reason"] == "non-finite weights"
  random = nnx.state(init_drafter(target.cfg, DrafterConfig(), seed=11), nnx.Param)
  assert pub.accept_len(good, tparams, sample) > pub.accept_len(random, tparams, sample) + 0.3
  assert not pub.publish(random, tparams, sample, current=good)
  assert "collapsed" in pub.events[-1]["reason"] and eng.weights.drafter_version == version
  assert pub.publish(good, tparams, sample, current=good)
  assert eng.weights.drafter_version == version + 1 == pub.version


@pytest.mark.slow  # a TLT run on two fake devices, in a subprocess
def test_spot_training_runs_only_on_idle_shards_and_publishes_to_every_shard():
  out = run_on_fake_devices("tests.drafter.shard_worker", devices=2, timeout=600)
  assert out["spot_steps"] > 0, out
  assert out["violations"] == [], out  # every spot step began after its device went idle
  assert out["published"] >= 1 and out["shards_identical"] is True
  assert out["rewards_equal_to_frozen"] is True  # coupled: the drafter changes speed only


@pytest.mark.slow  # a TLT run end to end, its export and a resume (~20 s)
@pytest.mark.long
def test_a_tlt_run_exports_a_policy_and_drafter_that_generate_can_load(tmp_path):
  w = workload()
  w.tokenizer = CharTokenizer(w.model.cfg.vocab_size)
  cfg = AdaptiveConfig(spot=SpotConfig(batch_rows=4, seq_len=16, budget_s=0.2, min_segments=4),
                       publish=PublishConfig(depth=3, min_ratio=0.0, seq_len=16))
  tr = Trainer(w, LoopConfig(str(tmp_path), steps=3, prompts_per_step=4, group_size=4,
                             export=True, checkpoint_every=1),
               engine_cfg=engine(),
               learner=GRPOConfig(), optim=OptimConfig(lr=1e-2, warmup_steps=0, total_steps=10),
               spec=SpecConfig(threshold=16, arms=EAGLE, min_accept_len=0.0),
               drafter=init_drafter(w.model.cfg, DrafterConfig(), seed=1), adaptive=cfg)
  hist = tr.run(progress=False)
  assert hist[-1]["drafter/steps"] > 0 and tr.adaptive.publisher.version >= 1
  assert hist[-1]["drafter/version"] == tr.engine.weights.drafter_version
  policy, tok = load_pretrained(str(tmp_path / "export" / "policy"))
  assert isinstance(tok, CharTokenizer)
  toks = jnp.asarray([[5, 6, 7, 8]])
  np.testing.assert_allclose(policy(toks).logits_BxTxV, tr.updater.model()(toks).logits_BxTxV,
                             atol=1e-5)
  drafter, meta = load_drafter(str(tmp_path / "export" / "drafter"), policy)
  assert meta["version"] == tr.adaptive.publisher.version
  for a, b in zip(jax.tree.leaves(nnx.state(drafter, nnx.Param)),
                  jax.tree.leaves(tr.adaptive.in_use)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  served = load_file(tmp_path / "export" / "drafter_eagle" / "model.safetensors")  # vLLM / SGLang
  np.testing.assert_array_equal(served["fc.weight"], np.asarray(drafter.fc.kernel[...]).T)
  assert "norm" in (tmp_path / "export" / "drafter_eagle" / "README.md").read_text()
  # Resuming restores the drafter, its optimizer and the published version.
  again = Trainer(w, LoopConfig(str(tmp_path), steps=3, prompts_per_step=4, group_size=4,
                                checkpoint_every=1),
                  engine_cfg=engine(),
                  learner=GRPOConfig(), optim=OptimConfig(lr=1e-2, warmup_steps=0, total_steps=10),
                  spec=SpecConfig(threshold=16, arms=EAGLE, min_accept_len=0.0),
                  drafter=init_drafter(w.model.cfg, DrafterConfig(), seed=1), adaptive=cfg)
  assert resume.restore(again)
  assert again.engine.weights.drafter_version == tr.engine.weights.drafter_version
  assert again.adaptive.spot.trainer.step_count == tr.adaptive.spot.trainer.step_count
