"""GSPO, the second learner: a sequence-level ratio and clip, through the same update and loop."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tests.conftest import small_config
from tests.rl.test_grpo import make_batch
from tests.rl.test_trainer import engine, workload
from tlt_jax.models import init_model
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.models.sharding import make_mesh
from tlt_jax.rl.grpo import GRPOConfig
from tlt_jax.rl.gspo import GSPOConfig
from tlt_jax.rl.learners import learner_from_section
from tlt_jax.rl.trainer import LoopConfig, Trainer
from tlt_jax.rl.update import OptimConfig, PolicyUpdater


def _rows(seed=0, rows=6, n=9):
  rng = np.random.default_rng(seed)
  mask = (np.arange(n)[None] < rng.integers(2, n + 1, size=rows)[:, None]).astype(np.float32)
  logp = jnp.asarray(rng.normal(size=(rows, n)) * 0.3 - 2.0, jnp.float32)
  return logp, jnp.asarray(mask), jnp.asarray(rng.normal(size=rows), jnp.float32)


def _grad(learner, logp, old, adv, mask):
  return jax.value_and_grad(lambda lp: learner.loss(lp, old, adv, mask)[0])(logp)


def test_at_ratio_one_gspo_is_grpo_with_sequence_aggregation():
  """d/dlogp_t of exp(mean_t(logp - old)) is 1/|y| at ratio 1: GRPO's sequence mean of token
  ratios, unclipped. Same loss and gradient."""
  logp, mask, adv = _rows()
  la, ga = _grad(GSPOConfig(), logp, logp, adv, mask)
  lb, gb = _grad(GRPOConfig(aggregation="sequence"), logp, logp, adv, mask)
  np.testing.assert_allclose(la, lb, rtol=1e-6)
  np.testing.assert_allclose(ga, gb, atol=1e-7)
  assert np.abs(np.asarray(ga)).max() > 1e-3  # not trivially zero


def test_gspo_clips_whole_sequences_and_grpo_clips_tokens():
  logp, mask, _ = _rows(rows=2, n=4)
  mask = jnp.ones_like(mask)
  adv = jnp.array([1.0, 1.0])
  # Row 0: token log-ratios +0.5 and -0.5 (mean 0: sequence ratio 1); row 1: +0.01 everywhere
  # (sequence ratio e^0.01, above GSPO's 1 + 4e-4 but inside GRPO's 1.28).
  old = logp - jnp.array([[0.5, -0.5, 0.5, -0.5], [0.01, 0.01, 0.01, 0.01]])
  _, m_gspo = GSPOConfig().loss(logp, old, adv, mask)
  _, m_grpo = GRPOConfig().loss(logp, old, adv, mask)
  assert float(m_gspo["clip_fraction"]) == pytest.approx(0.5)  # of sequences: row 1
  assert float(m_grpo["clip_fraction"]) == pytest.approx(0.5)  # of tokens: row 0's (e^+-0.5)
  g_gspo = np.asarray(_grad(GSPOConfig(), logp, old, adv, mask)[1])
  g_grpo = np.asarray(_grad(GRPOConfig(), logp, old, adv, mask)[1])
  assert np.all(g_gspo[1] == 0) and np.all(g_gspo[0] != 0)  # the clipped sequence: no push
  assert np.all(g_grpo[1] != 0)                             # its tokens, one by one: pushed


def test_gspo_micro_batches_accumulate_to_the_full_batch():
  """GSPO's loss is a mean over sequences: length-sorted micro-batches weighted by their rows
  give the full batch's loss and gradient."""
  ups = [PolicyUpdater(init_model(small_config(), seed=0), make_mesh(1, 1),
                       GSPOConfig(clip_low=0.2, clip_high=0.2),
                       OptimConfig(lr=1e-2, warmup_steps=0), SamplingParams(), micro_batches=k)
         for k in (1, 4)]
  ma, mb = (u.update(make_batch(seed=1)) for u in ups)
  np.testing.assert_allclose(ma["grad_norm"], mb["grad_norm"], rtol=1e-5)
  np.testing.assert_allclose(ma["loss"], mb["loss"], rtol=1e-5, atol=1e-7)
  assert ma["grad_norm"] > 0


def test_a_config_names_its_learner():
  c = ml_collections.ConfigDict(dict(grpo=dict(clip_low=0.1), gspo=dict(clip_high=1e-3)))
  assert learner_from_section(c) == GRPOConfig(clip_low=0.1)
  c.learner = "gspo"
  assert learner_from_section(c) == GSPOConfig(clip_high=1e-3)
  c.learner = "ppo"
  with pytest.raises(ValueError, match="'ppo' is not a learner; available: dapo, grpo, gspo"):
    learner_from_section(c)
  c.learner, c.gspo.clip_hihg = "gspo", 1.0
  with pytest.raises(ValueError, match="config.rl.gspo has no key 'clip_hihg'; did you mean "
                                       "config.rl.gspo.clip_high?"):
    learner_from_section(c)
  del c["gspo"]  # one home per default: without a section the learner takes its own
  assert learner_from_section(c) == GSPOConfig()


def test_a_gspo_run_trains_with_its_reference(tmp_path):
  tr = Trainer(workload(), LoopConfig(str(tmp_path), steps=2, prompts_per_step=4, group_size=4),
               engine_cfg=engine(), learner=GSPOConfig(clip_low=0.2, clip_high=0.2, kl_coef=0.1),
               optim=OptimConfig(lr=1e-2, warmup_steps=0, total_steps=10))
  hist = tr.run(progress=False)
  assert all(np.isfinite(m["train/loss"]) for m in hist) and hist[0]["train/grad_norm"] > 0
  # the frozen start is the reference
  assert hist[0]["train/kl"] < 1e-7 < 1e-6 < hist[1]["train/kl"]
