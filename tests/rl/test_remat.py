"""Rematerialisation (`train.remat`): the same loss and gradients as keeping every activation,
with fewer bytes held for the backward pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.conftest import small_config
from tlt_jax.models import init_model
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rl.grpo import token_logprobs


def _loss_and_grad(model, tokens_RxL, remat):
  """The jitted loss-and-gradient of the mean response log-prob, and the parameters."""
  graphdef, params = nnx.split(model, nnx.Param)

  def loss(p):
    lp, _ = token_logprobs(nnx.merge(graphdef, p), tokens_RxL, jnp.full((len(tokens_RxL),), 4),
                           8, SamplingParams(temperature=0.9), remat)
    return lp.mean()
  return jax.jit(jax.value_and_grad(loss)), params


@pytest.mark.parametrize("remat", ["dots", "full"])
def test_remat_gives_the_loss_and_gradients_of_the_plain_update(remat):
  model = init_model(small_config(), seed=0)
  tokens = jnp.asarray(np.random.default_rng(0).integers(3, 50, (4, 13)), jnp.int32)
  f, params = _loss_and_grad(model, tokens, "none")
  g, _ = _loss_and_grad(model, tokens, remat)
  (l0, g0), (l1, g1) = f(params), g(params)
  np.testing.assert_allclose(l1, l0, atol=1e-6)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_remat_lowers_what_the_backward_pass_keeps_at_smollm2_width():
  """Three layers of SmolLM2-135M's width, 2 rows of 256 tokens: the arrays the backward pass
  keeps (the residuals `jax.vjp` closes over, less the parameters) shrink with each policy, and
  under "full" to little more than each layer's input and the head's logits."""
  cfg = ModelConfig(vocab_size=512, d_model=576, n_layers=3, n_heads=9, n_kv_heads=3, d_ff=1536,
                    max_seq_len=512)
  graphdef, params = nnx.split(init_model(cfg, seed=0), nnx.Param)
  tokens = jnp.zeros((2, 257), jnp.int32)
  weights = sum(x.nbytes for x in jax.tree.leaves(params))
  kept = {}
  for remat in ("none", "dots", "full"):
    def loss(p, remat=remat):
      lp, _ = token_logprobs(nnx.merge(graphdef, p), tokens, jnp.full((2,), 4), 8,
                             SamplingParams(temperature=0.9), remat)
      return lp.mean()
    # The residuals' shapes alone (traced, not run: nothing is built or computed).
    vjp = jax.eval_shape(lambda p, loss=loss: jax.vjp(loss, p)[1], params)
    kept[remat] = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(vjp)) - weights
  layer_inputs = cfg.n_layers * 2 * 256 * cfg.d_model * 4
  logits = 2 * 256 * cfg.vocab_size * 4
  assert kept["full"] < kept["dots"] < kept["none"] / 2, kept
  assert kept["full"] < layer_inputs + 6 * logits, kept  # the head's few [R, T, V] arrays
