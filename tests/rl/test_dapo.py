"""The learner hooks at work: DAPO's dynamic sampling (groups with equal rewards dropped, top-up
rounds drawn by step, the same after a resume, nothing compiled after the warm-up) and overlong
penalty; several optimizer steps per rollout batch (the ratio leaves 1 and the clip acts); and
the step at the defaults is exactly the sequence of its parts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.rl.test_trainer import engine, workload
from tlt_jax import distributed
from tlt_jax.rl.dapo import DAPOConfig, overlong_penalty
from tlt_jax.rl.grpo import GRPOConfig, group_advantages
from tlt_jax.rl.samples import pack_rows
from tlt_jax.rl.trainer import LoopConfig, Trainer
from tlt_jax.rl.update import OptimConfig, PolicyBatch, PolicyUpdater
from tlt_jax.models.sharding import make_mesh
from tlt_jax.rollout.engine import RolloutEngine

OPTIM = OptimConfig(lr=1e-2, warmup_steps=0, total_steps=20)


def trainer(tmp_path, learner, steps=2, **loop):
  return Trainer(workload(), LoopConfig(str(tmp_path), steps, prompts_per_step=4, group_size=4,
                                        **loop),
                 engine_cfg=engine(), learner=learner, optim=OPTIM)


def test_the_overlong_penalty_ramps_over_the_buffer():
  got = overlong_penalty(np.array([0, 8, 9, 10, 12]), 12, 4, 0.5)
  np.testing.assert_allclose(got, [0.0, 0.0, -0.125, -0.25, -0.5])
  assert not overlong_penalty(np.array([12]), 12, 0, 1.0).any()  # off
  shaped = DAPOConfig(overlong_buffer=4).shape_rewards(np.ones(2, np.float32), np.array([3, 12]),
                                                       12)
  np.testing.assert_allclose(shaped, [1.0, 0.0])


def test_dynamic_sampling_keeps_mixed_groups_and_tops_up(tmp_path):
  tr = trainer(tmp_path, DAPOConfig(max_rounds=3))
  first, _, _ = tr.sample()
  equal = ~DAPOConfig().keep_groups(first.rewards_PxG())
  assert equal.any()  # the test's workload has groups with equal rewards to drop
  chosen, m = tr.select(first)
  assert chosen.num_groups == 4 and len(chosen.responses) == 16  # the update's shape is fixed
  active = chosen.active_R.reshape(4, 4).all(axis=1)
  assert m["kept_groups"] == active.sum() and m["top_up_rounds"] >= 1
  r = chosen.rewards_PxG()[active]
  assert (r.max(axis=1) > r.min(axis=1)).all()  # every group learned from has mixed rewards
  assert active.sum() == 4 or m["top_up_rounds"] == 3  # full, or the rounds ran out
  # Fillers carry no tokens into the update; kept rows keep theirs.
  _, _, mask = chosen.pack(tr.prompt_bucket, tr.w.params.max_new_tokens, 0)
  rows = np.repeat(active, 4)
  assert not mask[~rows].any() and (mask[rows].sum(axis=1) == chosen.lengths_R[rows]).all()


def test_a_dapo_run_resumes_with_the_same_top_ups_and_compiles_nothing(tmp_path):
  learner = DAPOConfig(max_rounds=2, overlong_buffer=4)
  straight = trainer(tmp_path / "straight", learner, steps=3).run(progress=False)
  trainer(tmp_path / "resumed", learner, steps=2, checkpoint_every=1).run(progress=False)
  resumed = trainer(tmp_path / "resumed", learner, steps=3, checkpoint_every=1).run(
      progress=False)
  assert sum(m["train/top_up_rounds"] for m in straight) >= 1
  for k in ("reward", "train/kept_groups", "train/top_up_rounds", "train/loss", "train/grad_norm"):
    assert resumed[0][k] == pytest.approx(straight[2][k], abs=1e-6), k
  assert all(m["compile_events"] == 0 for m in straight)  # top-ups reuse the warm-up's programs


def test_several_updates_per_rollout_move_the_ratio_and_engage_the_clip(tmp_path):
  one = trainer(tmp_path / "one", GRPOConfig(clip_low=0.05, clip_high=0.05)).run(progress=False)
  many_tr = trainer(tmp_path / "many", GRPOConfig(clip_low=0.05, clip_high=0.05),
                    mini_batches=2, update_epochs=2)
  many = many_tr.run(progress=False)
  assert all(m["train/ratio_mean"] == 1.0 and m["train/clip_fraction"] == 0.0 for m in one)
  assert all(m["train/optimizer_steps"] == 4 for m in many) and many_tr.updater.step_count == 8
  assert any(abs(m["train/ratio_mean"] - 1.0) > 1e-3 for m in many)
  assert any(m["train/clip_fraction"] > 0 for m in many)
  assert all(m["train/logprob_mismatch_max"] < 1e-5 for m in many)  # the first step's ratio is ~1
  assert all(m["compile_events"] == 0 for m in many)
  with pytest.raises(ValueError, match="do not split into 3 mini-batch"):
    trainer(tmp_path / "bad", GRPOConfig(), mini_batches=3)


def test_the_default_step_is_exactly_its_parts(tmp_path):
  """At mini_batches = update_epochs = 1 with GRPO, two trainer steps equal the loop written
  out by hand (draw, roll out, score, pack, advantages, one on-policy update): parameters bit for
  bit. A stage that changed the trajectory would show here."""
  tr = trainer(tmp_path, GRPOConfig())
  tr.run(progress=False)
  w = workload()
  updater = PolicyUpdater(w.model, make_mesh(1, 1), GRPOConfig(), OPTIM, w.params)
  eng = RolloutEngine(w.model, engine(max_prompt_len=max(len(p) for p in w.prompts)), pad_id=0)
  for step in range(2):
    idx = np.random.default_rng([0, step]).choice(len(w.prompts), 4, replace=False)
    prompts = [w.prompts[i] for i in idx]
    eng.weights.set_policy(distributed.local_copy(nnx.state(updater.model()), updater.mesh))
    res = eng.generate(prompts, 4, w.params, jax.random.fold_in(jax.random.key(0), step))
    rewards = w.rewards(res, [None] * 4, 4)
    toks, plen, mask = pack_rows([prompts[i // 4] for i in range(16)],
                                 [res.response(i) for i in range(16)], tr.prompt_bucket,
                                 w.params.max_new_tokens, 0)
    adv = group_advantages(jnp.asarray(rewards), 4)
    updater.update(PolicyBatch(toks, plen, mask, np.asarray(adv), None,
                               np.zeros(mask.shape, np.float32)))
  for a, b in zip(jax.tree.leaves(tr.updater.params), jax.tree.leaves(updater.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
