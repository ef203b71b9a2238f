"""GRPO: advantages, the clipped loss, log-prob recomputation, and the sharded update."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import run_on_fake_devices, small_config
from tlt_jax.models import init_model
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.models.sharding import make_mesh
from tlt_jax.rl.grpo import GRPOConfig, group_advantages, grpo_loss, token_logprobs
from tlt_jax.errors import ConfigError
from tlt_jax.rl.update import (OptimConfig, PolicyBatch, PolicyUpdater, length_groups,
                               token_groups, update_widths)
from tlt_jax.rollout import compiles
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine


def test_group_advantages():
  r = jnp.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
  np.testing.assert_allclose(group_advantages(r, 2, normalize_std=False), [0.5, -0.5, -0.5, 0.5,
                                                                           0, 0])
  a = group_advantages(r, 3)
  np.testing.assert_allclose(a[:3].mean(), 0.0, atol=1e-6)
  np.testing.assert_allclose(a[3:], 0.0)  # no signal in a group with equal rewards


def test_clipped_loss_values_kl_and_aggregation():
  cfg = GRPOConfig(clip_low=0.2, clip_high=0.3)
  mask = jnp.array([[1, 1, 0], [1, 0, 0]], jnp.float32)
  old = jnp.zeros((2, 3))
  logp = jnp.log(jnp.array([[1.5, 0.5, 1.0], [1.0, 1.0, 1.0]]))
  adv = jnp.array([1.0, -1.0])
  loss, m = grpo_loss(logp, old, adv, mask, cfg)
  # row 0: min(1.5, 1.3) = 1.3 and min(0.5, 0.8)*1 = 0.5; row 1: -(-1 * 1) = 1 ... token mean
  np.testing.assert_allclose(loss, (-1.3 - 0.5 + 1.0) / 3, atol=1e-6)
  assert abs(m["clip_fraction"] - 2 / 3) < 1e-6
  seq, _ = grpo_loss(logp, old, adv, mask, GRPOConfig(clip_low=0.2, clip_high=0.3,
                                                      aggregation="sequence"))
  np.testing.assert_allclose(seq, ((-1.3 - 0.5) / 2 + 1.0) / 2, atol=1e-6)
  _, mk = grpo_loss(logp, old, adv, mask, GRPOConfig(kl_coef=0.1), ref_logp_RxN=logp)
  assert abs(mk["kl"]) < 1e-7
  _, mk = grpo_loss(logp, old, adv, mask, GRPOConfig(kl_coef=0.1), ref_logp_RxN=old)
  assert mk["kl"] > 0


def test_trainer_logprobs_equal_the_rollouts():
  """The behaviour policy is defined once: recomputed log-probs match the engine's (1e-4)."""
  model = init_model(small_config(), seed=0)
  params = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=12, stop_tokens=(7,))
  prompts = [[3, 4, 5], [6, 7, 8, 9, 10]]
  res = RolloutEngine(model, EngineConfig(precompile=False)).generate(prompts, 2, params,
                                                                      jax.random.key(0))
  toks = np.zeros((4, 18), np.int32)
  for i in range(4):
    seq = prompts[i // 2] + res.response(i)
    toks[i, : len(seq)] = seq
  lp, ent = token_logprobs(model, jnp.asarray(toks), jnp.array([3, 3, 5, 5]), 12, params)
  mask = np.arange(12)[None] < res.lengths[:, None]
  np.testing.assert_allclose(np.where(mask, lp, 0), np.where(mask, res.logprobs, 0), atol=1e-4)
  assert np.all(np.asarray(ent)[mask] >= 0)


def make_batch(rows=8, seed=0):
  rng = np.random.default_rng(seed)
  toks = rng.integers(3, 53, size=(rows, 16)).astype(np.int32)
  mask = (np.arange(10)[None] < rng.integers(2, 10, size=rows)[:, None]).astype(np.float32)
  return PolicyBatch(jnp.asarray(toks), jnp.full((rows,), 6, jnp.int32), jnp.asarray(mask),
                     jnp.asarray(rng.normal(size=rows), jnp.float32),
                     jnp.asarray(rng.normal(size=(rows, 10)) * 0.1 - 4.0, jnp.float32),
                     jnp.zeros((rows, 10), jnp.float32))


def _updated(micro, mesh_shape=(1, 1), max_tokens=0, aggregation="sequence", warm_up=False,
             batch=None):
  up = PolicyUpdater(init_model(small_config(), seed=0), make_mesh(*mesh_shape),
                     GRPOConfig(aggregation=aggregation), OptimConfig(lr=1e-2, warmup_steps=0),
                     SamplingParams(), micro_batches=micro, max_tokens=max_tokens)
  if warm_up:
    up.warm_up(8, 6, 10, off_policy=True)
  built = compiles.Since()
  metrics = up.update(make_batch() if batch is None else batch)
  return up, dict(metrics, built=built.events)


def _close(a, b):
  """Parameters after one Adam step equal up to float rounding (see the test below)."""
  diff = np.concatenate([np.abs(np.asarray(x) - np.asarray(y)).ravel()
                         for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params))])
  return diff.max() < 1e-4 and np.mean(diff > 1e-5) < 1e-3


@pytest.mark.parametrize("aggregation", ["sequence", "token"])
def test_a_token_budget_update_equals_the_full_batch(aggregation):
  """`max_tokens` = 24 per device: the rows of width 16 go one per micro-batch and those of
  width 8 three per micro-batch, the last group padded with empty rows, which weigh nothing
  (also in a mean over rows). The gradient, the loss, the step and the log-probs equal the full
  batch's; after the warm-up (one shape per width) the update builds nothing."""
  b = make_batch()
  lens = np.array([9, 2, 9, 1, 9, 2, 2, 9])  # 6 + 9 tokens: width 16; 6 + 1 or 2: width 8
  batch = dataclasses.replace(b, mask_RxN=jnp.asarray(np.arange(10)[None] < lens[:, None],
                                                      jnp.float32))
  groups = token_groups(6 + lens, 24, 16, 1, 8)
  assert [(w, len(i), p) for i, w, p in groups] == [(16, 1, 1)] * 4 + [(8, 3, 3), (8, 1, 3)]
  full, mf = _updated(1, aggregation=aggregation, batch=batch)
  budget, mb = _updated(1, max_tokens=24, aggregation=aggregation, warm_up=True, batch=batch)
  assert mb["built"] == 0
  np.testing.assert_allclose(mf["grad_norm"], mb["grad_norm"], rtol=1e-5)
  np.testing.assert_allclose(mf["loss"], mb["loss"], rtol=1e-5)
  assert _close(full, budget)
  budget.params = full.params
  m = np.asarray(batch.mask_RxN) > 0
  for x, y in zip(full.logprobs(batch.tokens_RxL, batch.prompt_len_R, batch.mask_RxN),
                  budget.logprobs(batch.tokens_RxL, batch.prompt_len_R, batch.mask_RxN)):
    np.testing.assert_allclose(x[m], y[m], atol=1e-5)
  with pytest.raises(ConfigError, match="max_tokens_per_micro_batch=8 holds no row of 16 tokens"):
    _updated(1, max_tokens=8)


def test_micro_batch_accumulation_equals_the_full_batch():
  """Sequence aggregation over equal micro-batches is additive: the accumulated gradient (its
  norm, before Adam's normalisation hides scale) and the update equal the full batch's, up to
  float rounding."""
  a, ma = _updated(1)
  b, mb = _updated(2)
  np.testing.assert_allclose(ma["grad_norm"], mb["grad_norm"], rtol=1e-5)
  np.testing.assert_allclose(ma["loss"], mb["loss"], rtol=1e-5)
  la, lb = jax.tree.leaves(a.params), jax.tree.leaves(b.params)
  assert any(not np.allclose(x, y) for x, y in zip(la, jax.tree.leaves(
      nnx_state(init_model(small_config(), seed=0)))))
  # Adam's first step is lr * g / (|g| + eps): where a gradient is near zero, float rounding of
  # the sum (which differs with the split and with how XLA fuses the products) moves the step by
  # a fraction of lr. So: every parameter within 1% of lr, all but 0.1% of them within 0.1%.
  diff = np.concatenate([np.abs(np.asarray(x) - np.asarray(y)).ravel() for x, y in zip(la, lb)])
  assert diff.max() < 1e-4 and np.mean(diff > 1e-5) < 1e-3, (diff.max(), np.mean(diff > 1e-5))
  # The old-log-prob recomputation goes micro-batch by micro-batch too, to the same values.
  batch = make_batch()
  lpa, enta = a.logprobs(batch.tokens_RxL, batch.prompt_len_R, batch.mask_RxN)
  b.params = a.params
  lpb, entb = b.logprobs(batch.tokens_RxL, batch.prompt_len_R, batch.mask_RxN)
  m = np.asarray(batch.mask_RxN) > 0  # each group stops at its own width: compare real tokens
  np.testing.assert_allclose(lpa[m], lpb[m], atol=1e-5)
  np.testing.assert_allclose(enta[m], entb[m], atol=1e-5)


@pytest.mark.parametrize("aggregation,max_len_norm", [("token", 0), ("token", 16)])
def test_length_sorted_micro_batches_equal_the_full_batch_for_token_aggregation(
    aggregation, max_len_norm):
  """Token means and constant-normalised sums are exact too: each group's loss is weighted by
  its share of the batch's tokens (or 1), whatever lengths the sort puts together."""
  cfg = GRPOConfig(aggregation=aggregation, max_len_norm=max_len_norm)
  ups = [PolicyUpdater(init_model(small_config(), seed=0), make_mesh(1, 1), cfg,
                       OptimConfig(lr=1e-2, warmup_steps=0), SamplingParams(), micro_batches=k)
         for k in (1, 4)]
  ma, mb = (u.update(make_batch(seed=1)) for u in ups)
  np.testing.assert_allclose(ma["grad_norm"], mb["grad_norm"], rtol=1e-5)
  np.testing.assert_allclose(ma["loss"], mb["loss"], rtol=1e-5, atol=1e-7)


def test_length_groups_sort_rows_and_trim_each_group_to_a_power_of_two():
  used = np.array([3, 40, 9, 1, 17, 2, 64, 5])  # columns each row uses: prompt plus response
  groups = length_groups(used, 4, 80)
  assert [sorted(used[idx].tolist()) for idx, _ in groups] == [[1, 2], [3, 5], [9, 17], [40, 64]]
  assert [w for _, w in groups] == [8, 8, 32, 64]
  assert sorted(np.concatenate([idx for idx, _ in groups]).tolist()) == list(range(8))
  assert length_groups(np.full(8, 48), 2, 48)[0][1] == 48  # capped at the rows' width


@pytest.mark.parametrize("shortest", [0, 1, 9, 40, 70, 200])
def test_the_widths_built_are_those_rows_at_least_the_shortest_prompt_long_can_take(shortest):
  """The warm-up builds a program per width (`update_widths`): for rows no shorter than the
  shortest prompt, every width `length_groups` and `token_groups` give is among them, and none
  is narrower than that prompt's own (a chat template's prompts need no 8- to 32-column
  programs)."""
  width = 200
  widths = update_widths(width, shortest=shortest)
  assert widths[-1] == width and widths == sorted(set(widths))
  rng = np.random.default_rng(shortest)
  seen = set()
  for _ in range(200):
    used = rng.integers(shortest, width + 1, 16)
    seen |= {w for _, w in length_groups(used, 4, width)}
    seen |= {w for _, w, _ in token_groups(used, 400, width, 1, 16)}
  assert seen <= set(widths)
  # The narrowest is the width of a group of the shortest rows.
  assert widths[0] == length_groups(np.full(4, shortest), 1, width)[0][1]
  assert len(update_widths(width, shortest=70)) == len(update_widths(width)) - 4  # 8 to 64 gone


def test_short_prompts_are_trimmed_with_their_rows():
  """A micro-batch of short prompts and responses is cut to the columns its rows use, not to the
  prompt bucket plus its longest response, and its log-probs are those of the untrimmed rows."""
  up = PolicyUpdater(init_model(small_config(), seed=0), make_mesh(1, 1), GRPOConfig(),
                     OptimConfig(), SamplingParams(), micro_batches=2)
  rng = np.random.default_rng(4)
  plen = np.array([2, 3, 2, 3, 30, 28, 31, 29])        # the prompt bucket is 32
  rlen = np.array([5, 4, 6, 5, 5, 4, 6, 5])
  toks = np.zeros((8, 32 + 16), np.int32)
  mask = (np.arange(16)[None] < rlen[:, None]).astype(np.float32)
  for i in range(8):
    toks[i, : plen[i] + rlen[i]] = rng.integers(3, 53, size=plen[i] + rlen[i])
  groups = up.groups(toks, plen, mask)
  # Used columns 7-8 (was 32 + 8 before) and 32-37 (capped at the rows' 48).
  assert [(sorted(idx.tolist()), t, w) for idx, t, w, _ in groups] == [
      ([0, 1, 2, 3], 8, 8), ([4, 5, 6, 7], 48, 16)]
  lp, _ = up.logprobs(toks, plen, mask)
  full, _ = token_logprobs(up.model(), jnp.asarray(toks), jnp.asarray(plen), 16, SamplingParams())
  m = mask > 0
  np.testing.assert_allclose(lp[m], np.asarray(full)[m], atol=1e-5)


def nnx_state(model):
  from flax import nnx
  return nnx.state(model, nnx.Param)


def test_non_finite_update_is_refused_and_state_kept():
  up = PolicyUpdater(init_model(small_config(), seed=0), make_mesh(1, 1), GRPOConfig(),
                     OptimConfig(), SamplingParams())
  before = [np.asarray(x) for x in jax.tree.leaves(up.params)]
  bad = make_batch()
  bad = PolicyBatch(bad.tokens_RxL, bad.prompt_len_R, bad.mask_RxN, bad.adv_R.at[0].set(jnp.nan),
                    bad.old_logp_RxN, bad.ref_logp_RxN)
  with pytest.raises(FloatingPointError, match="was not applied"):
    up.update(bad)
  for x, y in zip(before, jax.tree.leaves(up.params)):
    np.testing.assert_array_equal(x, y)
  assert up.step_count == 0


def test_same_update_on_a_2_device_mesh():
  out = run_on_fake_devices("tests.rl.mesh_worker")
  # Updates are ~lr = 1e-2 in size; cross-device reduction order moves them by float rounding,
  # which Adam's first step (g / |g|) can amplify for near-zero gradients: 1e-4 is 1% of a step.
  assert max(out["max_diff_fsdp"], out["max_diff_data"], out["max_diff_tp"],
             out["max_diff_budget"]) < 1e-4
  assert out["sharded"] is True
  # Every layer's kernels split over tp; the embedding stays whole (tp = 2 does not divide the
  # test model's 53-token vocabulary).
  assert out["tp_split"] == ["down_proj/kernel", "gate_up_proj/kernel", "o_proj/kernel",
                             "qkv_proj/kernel"]
  assert out["tp_opt_split"] == 2 * 4 * 2  # Adam's two moments of each split kernel


def _kl_updater(kl_coef, seed=0):
  return PolicyUpdater(init_model(small_config(), seed=seed), make_mesh(1, 1),
                       GRPOConfig(aggregation="token", kl_coef=kl_coef),
                       OptimConfig(lr=1e-2, warmup_steps=0), SamplingParams())


def _kl_batch(up, seed=0):
  """A batch with zero advantages (only the KL term pulls) and the reference's log-probs."""
  b = make_batch(seed=seed)
  old, _ = up.logprobs(b.tokens_RxL, b.prompt_len_R, b.mask_RxN)
  ref = up.ref_logprobs(b.tokens_RxL, b.prompt_len_R, b.mask_RxN)
  return PolicyBatch(b.tokens_RxL, b.prompt_len_R, b.mask_RxN, jnp.zeros_like(b.adv_R),
                     jnp.asarray(old), jnp.asarray(ref))


def test_the_kl_term_is_zero_at_the_reference_and_pulls_back_toward_it():
  up = _kl_updater(0.5)
  b = make_batch()
  lp, _ = up.logprobs(b.tokens_RxL, b.prompt_len_R, b.mask_RxN)
  np.testing.assert_array_equal(up.ref_logprobs(b.tokens_RxL, b.prompt_len_R, b.mask_RxN), lp)
  assert up.update(_kl_batch(up))["kl"] < 1e-7  # policy = reference (up to fusion rounding)
  # Move the policy away from its reference: the penalty's descent direction points back toward
  # the reference, and updates driven by the KL term alone shrink it.
  up.params = _kl_updater(0.5, seed=1).params
  batch = _kl_batch(up)
  grads, _, _ = up.gradient(batch)
  toward = sum(float(jnp.sum(-g * (r - p))) for g, r, p in zip(
      jax.tree.leaves(grads), jax.tree.leaves(up.ref_params), jax.tree.leaves(up.params)))
  assert toward > 0
  kls = [up.update(_kl_batch(up))["kl"] for _ in range(4)]
  assert kls[0] > 0.01 and kls[-1] < 0.7 * kls[0], kls


def test_without_a_kl_term_no_reference_is_kept():
  up = _kl_updater(0.0)
  b = make_batch()
  assert up.ref_params is None
  np.testing.assert_array_equal(up.ref_logprobs(b.tokens_RxL, b.prompt_len_R, b.mask_RxN), 0.0)


def test_an_on_policy_update_takes_its_old_log_probs_from_its_own_forward_pass():
  """`old_logp_RxN=None` (what the trainer sends: one update per batch of the policy's own
  rollouts) is the update with the recomputed log-probs as the old ones, without the separate
  forward pass: the same loss, gradient and step up to float rounding, a ratio of exactly 1, and
  the log-probs it returns are `logprobs`'."""
  a, b = (PolicyUpdater(init_model(small_config(), seed=0), make_mesh(1, 1),
                        GRPOConfig(aggregation="token"), OptimConfig(lr=1e-2, warmup_steps=0),
                        SamplingParams(), micro_batches=2) for _ in range(2))
  batch = make_batch(seed=2)
  old, _ = a.logprobs(batch.tokens_RxL, batch.prompt_len_R, batch.mask_RxN)
  ma = a.update(PolicyBatch(batch.tokens_RxL, batch.prompt_len_R, batch.mask_RxN, batch.adv_R,
                            jnp.asarray(old), batch.ref_logp_RxN))
  mb, lp = b.update(PolicyBatch(batch.tokens_RxL, batch.prompt_len_R, batch.mask_RxN,
                                batch.adv_R, None, batch.ref_logp_RxN), with_logprobs=True)
  m = np.asarray(batch.mask_RxN) > 0
  np.testing.assert_allclose(lp[m], old[m], atol=1e-5)
  assert mb["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and mb["clip_fraction"] == 0.0
  np.testing.assert_allclose(mb["loss"], ma["loss"], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(mb["grad_norm"], ma["grad_norm"], rtol=1e-5)
  diff = np.concatenate([np.abs(np.asarray(x) - np.asarray(y)).ravel()
                         for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params))])
  assert diff.max() < 1e-4 and np.mean(diff > 1e-5) < 1e-3, (diff.max(), np.mean(diff > 1e-5))
