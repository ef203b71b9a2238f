"""Prompt-addressed noise and replay in the RL loop: a run whose prompts repeat replays part of
each step's responses and is the run without replay; its memory survives a resume."""

import dataclasses

import pytest

from tests.rl.test_trainer import KEYS, engine, workload
from tlt_jax.errors import ConfigError
from tlt_jax.models.precision import Precision
from tlt_jax.rl.config import replay_config
from tlt_jax.rl.grpo import GRPOConfig
from tlt_jax.rl.trainer import LoopConfig, Trainer
from tlt_jax.rl.update import OptimConfig
from tlt_jax.rollout.history import HistoryConfig, ReplayConfig
from tlt_jax.spec.strategy import SpecConfig, Strategy

POOL = 4  # every step draws the whole pool: each prompt comes back every step


def _run(tmp_path, name, steps, replay: ReplayConfig, temperature=1.0, checkpoint_every=0,
         precision: Precision | None = None):
  w = workload()
  if precision is not None:
    w.model = precision.apply(w.model)
  w.params = dataclasses.replace(w.params, temperature=temperature)
  tr = Trainer(w, LoopConfig(str(tmp_path / name), steps, prompts_per_step=POOL, group_size=4,
                             checkpoint_every=checkpoint_every),
               engine_cfg=engine(), learner=GRPOConfig(),
               optim=OptimConfig(lr=1e-2, warmup_steps=0, total_steps=10),
               prompt_pool=w.prompts[:POOL], answers=w.answers[:POOL], replay=replay)
  return tr.run(progress=False)


PROMPT = ReplayConfig(noise="prompt")
REPLAY = ReplayConfig(noise="prompt", history=HistoryConfig(max_tokens=10_000, chunk=4))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_replay_is_the_same_run_as_decoding_afresh(tmp_path, temperature):
  fresh = _run(tmp_path, "fresh", 3, PROMPT, temperature)
  replayed = _run(tmp_path, "replayed", 3, REPLAY, temperature)
  for a, b in zip(fresh, replayed):
    for k in KEYS:
      assert a[k] == pytest.approx(b[k], abs=1e-5), k
  assert replayed[0]["rollout/replay_fraction"] == 0.0  # nothing stored yet
  assert all(m["rollout/replay_fraction"] > 0.2 for m in replayed[1:])
  assert all(m["rollout/replay_fraction"] == 0.0 for m in fresh)
  if temperature:
    assert any(m["train/grad_norm"] > 0 for m in fresh)  # the policy moved between visits


def test_in_bf16_invariant_numerics_replay_is_bitwise_the_same_run(tmp_path):
  """bf16, where a verify of a replayed chunk and a decode step round alike only in invariant
  numerics: the run with replay equals the run without exactly (rewards, losses, gradient
  norms), and the trainer recomputes the rollout's log-probs bit for bit."""
  inv = Precision(compute_dtype="bfloat16", numerics="invariant")
  fresh = _run(tmp_path, "fresh", 2, PROMPT, precision=inv)
  replayed = _run(tmp_path, "replayed", 2, REPLAY, precision=inv)
  assert replayed[1]["rollout/replay_fraction"] > 0.2
  for a, b in zip(fresh, replayed):
    assert [a[k] for k in KEYS] == [b[k] for k in KEYS]
    assert a["train/logprob_mismatch_max"] == b["train/logprob_mismatch_max"] == 0.0


def test_a_resumed_run_replays_what_a_straight_run_does(tmp_path):
  straight = _run(tmp_path, "straight", 3, REPLAY)
  _run(tmp_path, "resumed", 2, REPLAY, checkpoint_every=1)
  resumed = _run(tmp_path, "resumed", 3, REPLAY, checkpoint_every=1)
  assert len(resumed) == 1 and resumed[0]["step"] == 2
  for k in KEYS + ("rollout/replay_fraction",):
    assert resumed[0][k] == pytest.approx(straight[2][k], abs=1e-5), k
  assert resumed[0]["rollout/replay_fraction"] > 0.2  # its store came back with the checkpoint


def test_replay_settings_are_one_line_errors():
  coupled = SpecConfig(arms=(Strategy(depth=3),))
  rejection = SpecConfig(arms=(Strategy(depth=3),), rule="rejection")
  section = {"noise": "prompt", "history": {"max_tokens": 100, "chunk": 4}}
  assert replay_config(section, coupled).chunk == 4
  with pytest.raises(ConfigError, match="'coupled' rule only"):
    replay_config(section, rejection)
  with pytest.raises(ConfigError, match="set rollout.noise = 'prompt'"):
    replay_config({"history": {"max_tokens": 100}}, None)
  with pytest.raises(ConfigError, match="set history.max_tokens > 0"):
    replay_config({"noise": "prompt", "history": {"chunk": 4}}, None)
  with pytest.raises(ConfigError, match="did you mean config.rollout.history.chunk"):
    replay_config({"noise": "prompt", "history": {"chunks": 4}}, None)
  with pytest.raises(ConfigError, match="noise must be one of"):
    replay_config({"noise": "per-prompt"}, None)
