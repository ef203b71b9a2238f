"""The one optimizer builder: its learning rate warms up, then decays to its end value or holds."""

import jax.numpy as jnp
import numpy as np

from tlt_jax import optim


def _step_sizes(opt, steps):
  """|update| per step for a constant unit gradient: Adam's normalised step is the learning rate."""
  params, grads = {"w": jnp.zeros(3)}, {"w": jnp.ones(3)}
  state, sizes = opt.init(params), []
  for _ in range(steps):
    upd, state = opt.update(grads, state, params)
    sizes.append(float(jnp.abs(upd["w"][0])))
  return np.array(sizes)


def test_warm_up_then_cosine_decay_to_the_end_fraction():
  s = _step_sizes(optim.adamw(1.0, warmup_steps=2, total_steps=10, end_lr_fraction=0.1,
                              clip=1e9), 12)
  np.testing.assert_allclose(s[:3], [0.0, 0.5, 1.0], atol=1e-5)
  assert np.all(np.diff(s[2:11]) < 0)
  np.testing.assert_allclose(s[10:], 0.1, atol=1e-5)


def test_without_an_end_the_rate_holds_after_warm_up():
  s = _step_sizes(optim.adamw(0.5, warmup_steps=4, clip=1e9), 10)
  np.testing.assert_allclose(s[:5], [0.0, 0.125, 0.25, 0.375, 0.5], atol=1e-5)
  np.testing.assert_allclose(s[4:], 0.5, atol=1e-5)


def test_no_warm_up_steps_at_the_rate_from_the_first_with_or_without_an_end():
  np.testing.assert_allclose(_step_sizes(optim.adamw(0.5, warmup_steps=0, clip=1e9), 3), 0.5,
                             atol=1e-5)
  first = _step_sizes(optim.adamw(0.5, warmup_steps=0, total_steps=10, clip=1e9), 1)
  np.testing.assert_allclose(first, [0.5], atol=1e-5)


def test_a_run_shorter_than_its_warm_up_still_reaches_its_rate():
  s = _step_sizes(optim.adamw(1.0, warmup_steps=50, total_steps=3, clip=1e9), 4)
  np.testing.assert_allclose(s, [0.0, 0.5, 1.0, 0.1], atol=1e-5)  # warm-up cut to 2 steps
