"""The processed distribution and addressed Gumbel-max sampling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.statistics import chi_square_pvalue
from tlt_jax.models.sampling import SamplingParams, gumbel_noise, processed_logprobs, sample

LOGITS = jnp.array([2.0, 1.5, 1.0, 0.2, -0.5, -1.0])


def test_top_k_and_top_p_supports():
  lp = processed_logprobs(LOGITS, SamplingParams(temperature=1.0, top_k=3))
  assert np.isfinite(lp[:3]).all() and np.isneginf(lp[3:]).all()
  p = jax.nn.softmax(LOGITS)
  # top_p just above the first two tokens' mass keeps exactly three tokens.
  lp = processed_logprobs(LOGITS, SamplingParams(temperature=1.0, top_p=float(p[:2].sum()) + 1e-3))
  assert np.isfinite(lp[:3]).all() and np.isneginf(lp[3:]).all()
  np.testing.assert_allclose(jnp.exp(lp).sum(), 1.0, atol=1e-6)
  lp = processed_logprobs(LOGITS, SamplingParams(temperature=0.5))
  np.testing.assert_allclose(lp, jax.nn.log_softmax(LOGITS / 0.5), atol=1e-6)


def _empirical(params, n=40000):
  # The draws' logits and addresses are arguments, not constants the program closes over: XLA
  # would fold the noise of 40k constant rows at compile time (15 s of compiling, not sampling).
  ids = jnp.arange(n)
  logits = jnp.broadcast_to(LOGITS, (n, LOGITS.shape[0]))
  toks, lp = jax.jit(lambda x, i, k: sample(x, params, k, i, jnp.zeros_like(i)))(
      logits, ids, jax.random.key(0))
  return np.bincount(np.asarray(toks), minlength=6) / n, toks, lp


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, top_p=0.9),
                                    SamplingParams(temperature=0.7, top_k=4)])
def test_sampling_matches_processed_distribution(params):
  """Chi-square goodness of fit at significance 1e-3 with 40k draws (fixed seed)."""
  freq, toks, lp = _empirical(params)
  want = np.asarray(jnp.exp(processed_logprobs(LOGITS, params)))
  assert chi_square_pvalue(freq * 40000, want) > 1e-3
  # The same test rejects a subtly wrong distribution: tempered but not truncated.
  wrong = np.asarray(jax.nn.softmax(LOGITS / params.temperature))
  assert chi_square_pvalue(freq * 40000, wrong) < 1e-6
  np.testing.assert_allclose(lp, processed_logprobs(LOGITS, params)[toks], atol=1e-6)


def test_noise_is_addressed_by_sample_and_position():
  params = SamplingParams(temperature=1.0)
  logits = jnp.zeros((4, 50))
  key = jax.random.key(3)
  a, _ = sample(logits, params, key, jnp.array([0, 1, 2, 3]), jnp.array([5, 5, 5, 5]))
  b, _ = sample(logits[::-1], params, key, jnp.array([3, 2, 1, 0]), jnp.array([5, 5, 5, 5]))
  np.testing.assert_array_equal(a, b[::-1])
  c, _ = sample(logits, params, key, jnp.array([0, 1, 2, 3]), jnp.array([6, 6, 6, 6]))
  assert not np.array_equal(a, c)


def test_a_zero_padded_address_is_the_noise_of_its_first_word():
  """`[i]` and `[i, 0, 0, 0, 0]` are the same noise (a held-out evaluation's under either noise
  mode), `[i]` is `fold_in(fold_in(key, i), t)` as before; addresses that differ in any word,
  zeros between or after other words included, are different noise."""
  key = jax.random.key(3)
  ids, pos = jnp.arange(6), jnp.arange(6) + 2
  padded = jnp.stack([ids] + [jnp.zeros(6, jnp.int32)] * 4, axis=1)
  np.testing.assert_array_equal(gumbel_noise(key, ids, pos, 50), gumbel_noise(key, padded, pos, 50))
  want = jax.random.gumbel(jax.random.fold_in(jax.random.fold_in(key, 4), 6), (50,), jnp.float32)
  np.testing.assert_array_equal(gumbel_noise(key, ids, pos, 50)[4], want)
  addresses = jnp.array([[7, 0, 0, 0, 0], [7, 0, 0, 0, 1], [7, 0, 0, 1, 0], [7, 0, 1, 0, 0],
                         [7, 1, 0, 0, 0], [7, 0, 0, 1, 1], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0]])
  g = np.asarray(gumbel_noise(key, addresses, jnp.zeros(8, jnp.int32), 50))
  assert len({row.tobytes() for row in g}) == 8


def test_greedy_is_argmax_and_bad_params_raise():
  toks, _ = sample(LOGITS[None], SamplingParams(temperature=0.0), jax.random.key(0),
                   jnp.array([0]), jnp.array([0]))
  assert int(toks[0]) == 0
  with pytest.raises(ValueError, match="top_p"):
    SamplingParams(top_p=0.0)
  with pytest.raises(ValueError, match="temperature"):
    SamplingParams(temperature=-1)
