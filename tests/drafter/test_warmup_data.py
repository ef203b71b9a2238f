"""The warm-up's data cache: a second recipe on the same target and prompts trains on the first
one's rollouts and features instead of sampling and computing them again."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.conftest import small_config
from tests.test_optim import _step_sizes
from tlt_jax.drafter import warmup, warmup_data
from tlt_jax.drafter.model import DrafterConfig, init_drafter
from tlt_jax.drafter.proposer import EagleProposer
from tlt_jax.drafter.train import DrafterTrainConfig, DrafterTrainer
from tlt_jax.models import init_model
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rollout.plain import pad_prompts

PROMPTS = [[1, 5, 9], [2, 6], [3, 7, 11, 4]]
PARAMS = SamplingParams(temperature=0.9, max_new_tokens=6)
WCFG = warmup.WarmupConfig(steps=2, batch_rows=4, seq_len=12, group_size=2)


def _warm_up(target, dcfg, root, params=PARAMS):
  return warmup.warm_up(target, PROMPTS, params, pad_id=0, dcfg=dcfg,
                        tcfg=DrafterTrainConfig(), wcfg=WCFG, cache_root=str(root),
                        progress=False)


def test_a_second_recipe_trains_on_the_first_one_s_rollouts_and_features(tmp_path, monkeypatch):
  target = init_model(small_config(), seed=0)
  calls = []
  real_rollouts, real_features = warmup_data.rollout_sequences, warmup_data.teacher_features
  monkeypatch.setattr(warmup_data, "rollout_sequences",
                      lambda *a, **k: calls.append("rollouts") or real_rollouts(*a, **k))
  monkeypatch.setattr(warmup_data, "teacher_features",
                      lambda *a, **k: calls.append("features") or real_features(*a, **k))
  _, first = _warm_up(target, DrafterConfig(), tmp_path)
  assert calls == ["rollouts", "features"] and first["data_loaded"] == []

  # Another loss: the same rollouts and features, read back, train a drafter of its own key.
  _, second = _warm_up(target, DrafterConfig(tv_weight=0.5), tmp_path)
  assert calls == ["rollouts", "features"] and second["data_loaded"] == ["rollouts", "features"]
  assert second["key"] != first["key"]

  # Other target layers: the rollouts again, new features; another temperature: new rollouts.
  _warm_up(target, DrafterConfig(feature_layers=(0, 1)), tmp_path)
  assert calls == ["rollouts", "features", "features"]
  _warm_up(target, DrafterConfig(), tmp_path, SamplingParams(temperature=0.7, max_new_tokens=6))
  assert calls == ["rollouts", "features", "features", "rollouts", "features"]


def test_cached_rollouts_and_features_equal_computed_ones(tmp_path):
  target = init_model(small_config(), seed=0)
  dcfg = DrafterConfig(feature_layers=(0, 1))
  data = lambda: warmup_data.WarmupData(str(tmp_path), target, "t", PROMPTS, PARAMS, 2, 12, 0, 0)
  fresh = data()
  toks, mask = fresh.sequences()
  feats, hidden = fresh.features(toks, mask, dcfg, progress=False)
  again = data()
  toks2, mask2 = again.sequences()
  feats2, hidden2 = again.features(toks2, mask2, dcfg, progress=False)
  assert again.loaded == ["rollouts", "features"]
  for a, b in ((toks, toks2), (mask, mask2), (feats, feats2), (hidden, hidden2)):
    assert a.dtype == b.dtype and np.array_equal(a, b)
  assert feats.shape[-1] == 2 * hidden.shape[-1]  # two fused layers, the final hidden beside
  assert not list(tmp_path.glob("*.tmp"))


def test_features_cover_the_columns_up_to_the_longest_row_as_the_full_forward_does():
  """The forward runs over the columns up to the longest row's end rounded up to 64 (here 70 of
  130 tokens: 128 columns), in a chunk of 4 rows for 3; what it computes is the full forward's."""
  target = init_model(small_config(max_seq_len=192), seed=0)
  dcfg = DrafterConfig(feature_layers=(0, 1))
  toks = np.random.default_rng(0).integers(3, 50, (3, 130)).astype(np.int32)
  mask = np.zeros(toks.shape, np.float32)
  for row, n in enumerate((70, 12, 40)):
    mask[row, :n] = 1
  feats, hidden = warmup_data.teacher_features(target, toks, dcfg, mask, progress=False)
  full_feats, full_hidden = warmup_data.teacher_features(target, toks, dcfg, progress=False)
  assert feats.shape[:2] == hidden.shape[:2] == (3, 128) and full_feats.shape[1] == 130
  np.testing.assert_allclose(feats, full_feats[:, :128], atol=1e-5)
  np.testing.assert_allclose(hidden, full_hidden[:, :128], atol=1e-5)


@pytest.mark.parametrize("what", ["rollouts", "features"])
def test_a_half_written_file_is_never_read(tmp_path, what):
  """A crash mid-write leaves only the temporary file, which the next warm-up ignores."""
  target = init_model(small_config(), seed=0)
  data = warmup_data.WarmupData(str(tmp_path), target, "t", PROMPTS, PARAMS, 2, 12, 0, 0)
  toks, mask = data.sequences()
  data.features(toks, mask, DrafterConfig(), progress=False)
  path = next(tmp_path.glob(f"{what}-*.safetensors"))
  path.rename(path.parent / f"{path.name}.tmp")
  again = warmup_data.WarmupData(str(tmp_path), target, "t", PROMPTS, PARAMS, 2, 12, 0, 0)
  toks2, mask2 = again.sequences()
  again.features(toks2, mask2, DrafterConfig(), progress=False)
  assert what not in again.loaded


def test_held_out_metrics_are_the_training_step_s_at_the_drafted_positions(tmp_path):
  target = init_model(small_config(), seed=0)
  drafter = init_drafter(target.cfg, DrafterConfig(unroll_steps=2, tv_weight=0.5), seed=1)
  data = warmup_data.WarmupData(str(tmp_path), target, "t", PROMPTS, PARAMS, 2, 12, 0, 0)
  before = jax.tree.map(np.asarray, nnx.state(drafter, nnx.Param))
  held_out = warmup.teacher_forced_metrics(drafter, target, data, batch_rows=6, progress=False)
  assert jax.tree.all(jax.tree.map(np.array_equal, before, nnx.state(drafter, nnx.Param)))
  toks, mask = data.sequences()
  feats, hidden = data.features(toks, mask, drafter.cfg, progress=False)
  toks, mask = toks[:, :feats.shape[1]], mask[:, :feats.shape[1]]
  # Scored where the drafter drafts; `step` reports its metrics before its update.
  step = DrafterTrainer(drafter, target).step(toks, feats, hidden, data.drafted(mask))
  assert {"total_variation", "total_variation_d2", "top1_agreement_d2"} <= set(held_out)
  assert held_out == pytest.approx({k: round(v, 4) for k, v in step.items()}, abs=1e-4)


def test_held_out_metrics_give_the_target_s_mass_inside_a_restricted_draft_vocabulary(tmp_path):
  """The bound a restricted vocabulary puts on acceptance: the target's probability (at the
  label temperature) on those tokens where depth 1 is scored, computed here with numpy."""
  target = init_model(small_config(), seed=0)
  data = warmup_data.WarmupData(str(tmp_path), target, "t", PROMPTS, PARAMS, 2, 12, 0, 0)
  toks, mask = data.sequences()
  ids = (0, 3, 7, 11, 20, 31, 44)
  drafter = init_drafter(target.cfg, DrafterConfig(draft_vocab=len(ids), vocab_ids=ids,
                                                   label_temperature=0.7), seed=1)
  held_out = warmup.teacher_forced_metrics(drafter, target, data, batch_rows=6, progress=False)
  _, hidden = data.features(toks, mask, drafter.cfg, progress=False)
  logits = np.asarray(target.head(jnp.asarray(hidden)), np.float64) / 0.7
  p = np.exp(logits - logits.max(-1, keepdims=True))
  mass = (p[..., list(ids)].sum(-1) / p.sum(-1))[:, 1:]  # index t is scored at t + 1
  drafted = data.drafted(mask)
  m = drafted[:, :-1] * drafted[:, 1:]
  assert 0 < held_out["draft_vocab_mass"] < 1
  assert held_out["draft_vocab_mass"] == pytest.approx((mass * m).sum() / m.sum(), abs=1e-4)
  whole = init_drafter(target.cfg, DrafterConfig(), seed=1)  # no restriction, no bound to report
  assert "draft_vocab_mass" not in warmup.teacher_forced_metrics(whole, target, data, 6, False)


def test_the_prefill_gives_the_drafter_the_prompt_to_attend_to():
  """Why drafted positions are scored with the prompts kept as context: the engine's prefill
  (`EagleProposer.prefill`) fills the drafter's cache with the prompt's pairs, positions 0 ..
  P - 2, exactly the entries teacher forcing computes for them."""
  target = init_model(small_config(), seed=0)
  drafter = init_drafter(target.cfg, DrafterConfig(), seed=1)
  proposer = EagleProposer(drafter)
  prompts_UxP, lens_U = pad_prompts(PROMPTS, 4)
  out = target(jnp.asarray(prompts_UxP))
  state = proposer.prefill(target, proposer.init_state(target.cfg, len(PROMPTS), 8),
                           jnp.asarray(prompts_UxP), out, jnp.asarray(lens_U))
  np.testing.assert_array_equal(state.cache.lengths_B, lens_U - 1)
  _, (_, v_BxKxTxH) = drafter.teacher_step(target.embed_tokens(jnp.asarray(prompts_UxP[:, 1:])),
                                           drafter.project(out.hidden_BxTxD[:, :-1]))
  for row, n in enumerate(lens_U):
    np.testing.assert_allclose(state.cache.v[0][row, :, : n - 1], v_BxKxTxH[row, :, : n - 1],
                               atol=1e-5)


def test_without_the_prompt_loss_the_drafter_trains_on_the_positions_it_drafts(tmp_path,
                                                                               monkeypatch):
  """Position t drafts token t + 2 from token t + 1 and the target's state at t, so the first
  drafted position is a row's last prompt token; `prompt_loss=False` masks the ones before and
  keeps them in the sequence, as context."""
  target = init_model(small_config(), seed=0)
  data = warmup_data.WarmupData(str(tmp_path), target, "t", PROMPTS, PARAMS, 2, 12, 0, 0)
  toks, mask = data.sequences()
  drafted = data.drafted(mask)
  for row, p in enumerate([q for q in PROMPTS for _ in range(2)]):
    assert not drafted[row, : len(p) - 1].any()
    np.testing.assert_array_equal(drafted[row, len(p) - 1:], mask[row, len(p) - 1:])
  batches = []
  real_step = DrafterTrainer.step
  monkeypatch.setattr(DrafterTrainer, "step", lambda self, t, f, h, m: batches.append(
      (np.asarray(t), np.asarray(m))) or real_step(self, t, f, h, m))
  wcfg = dataclasses.replace(WCFG, prompt_loss=False)
  _, meta = warmup.warm_up(target, PROMPTS, PARAMS, pad_id=0, dcfg=DrafterConfig(),
                           tcfg=DrafterTrainConfig(), wcfg=wcfg, cache_root=str(tmp_path),
                           progress=False)
  rows = {tuple(t): d for t, d in zip(toks, drafted)}
  assert batches
  for t_BxL, m_BxL in batches:
    for t, m in zip(t_BxL, m_BxL):
      np.testing.assert_array_equal(m, rows[tuple(t)])
  # The key: unchanged by the field at its former value, changed without the prompt loss.
  keys = {x: warmup.warmup_key(target, PROMPTS, PARAMS, DrafterConfig(), DrafterTrainConfig(),
                               dataclasses.replace(WCFG, prompt_loss=x)) for x in (True, False)}
  assert keys[False] == meta["key"] != keys[True]


def test_a_warm_up_of_known_length_decays_its_rate_and_keys_apart():
  """`decay_steps` decays the drafter's rate by a cosine to a tenth at that step (0 holds it, as
  the spot trainer needs); a decayed recipe is another drafter, so another cache key."""
  held = _step_sizes(DrafterTrainConfig(lr=1.0, warmup_steps=2, clip=1e9).optimizer(), 12)
  decayed = _step_sizes(
      DrafterTrainConfig(lr=1.0, warmup_steps=2, clip=1e9, decay_steps=10).optimizer(), 12)
  np.testing.assert_allclose(held[2:], 1.0, atol=1e-5)
  np.testing.assert_allclose(decayed[:3], [0.0, 0.5, 1.0], atol=1e-5)
  assert np.all(np.diff(decayed[2:11]) < 0)
  np.testing.assert_allclose(decayed[10:], 0.1, atol=1e-5)
  target = init_model(small_config(), seed=0)
  keys = {n: warmup.warmup_key(target, PROMPTS, PARAMS, DrafterConfig(),
                               DrafterTrainConfig(decay_steps=n), WCFG) for n in (0, 400)}
  assert keys[0] != keys[400]
