"""Model correctness: cache decoding equals the full forward; GQA; RoPE layouts; causality."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.conftest import small_config
from tlt_jax.models import commit, init_cache, init_model
from tlt_jax.models.layers import fused_linear


def _rand_tokens(key, b, t, v=53):
  return jax.random.randint(jax.random.key(key), (b, t), 3, v)


def test_cache_one_token_at_a_time_equals_full_forward_with_ragged_prompts(small_model):
  toks = _rand_tokens(1, 3, 20)
  full = small_model(toks)
  prompt_lens = jnp.array([5, 9, 3])
  cache = init_cache(small_model.cfg, 3, 32)
  out = small_model(toks[:, :9], cache)  # padded prefill; rows commit their own length
  cache = commit(out.cache, prompt_lens)
  for b in range(3):
    np.testing.assert_allclose(out.logits_BxTxV[b, : prompt_lens[b]],
                               full.logits_BxTxV[b, : prompt_lens[b]], atol=1e-5)
  # Each row continues from its own length with its own true next tokens.
  for _ in range(8):
    pos = cache.lengths_B
    step_toks = jnp.take_along_axis(toks, pos[:, None], axis=1)
    out = small_model(step_toks, cache)
    cache = commit(out.cache, jnp.ones(3, jnp.int32))
    want = jnp.take_along_axis(full.logits_BxTxV, pos[:, None, None], axis=1)
    np.testing.assert_allclose(out.logits_BxTxV, want, atol=1e-5)
    want_h = jnp.take_along_axis(full.hidden_BxTxD, pos[:, None, None], axis=1)
    np.testing.assert_allclose(out.hidden_BxTxD, want_h, atol=1e-5)


def test_cache_many_tokens_at_once_equals_full_forward(small_model):
  toks = _rand_tokens(2, 2, 16)
  full = small_model(toks)
  cache = commit(small_model(toks[:, :6], init_cache(small_model.cfg, 2, 24)).cache,
                 jnp.array([6, 6]))
  out = small_model(toks[:, 6:11], cache)
  np.testing.assert_allclose(out.logits_BxTxV, full.logits_BxTxV[:, 6:11], atol=1e-5)


def _tree():
  # parents of a 7-node tree; node 0 hangs off the committed prefix.
  parents = [-1, 0, 0, 1, 1, 2, 4]
  t = len(parents)
  anc = np.zeros((t, t), bool)
  depth = np.zeros(t, np.int32)
  for i in range(t):
    j = i
    while j >= 0:
      anc[i, j] = True
      j = parents[j]
    depth[i] = anc[i].sum() - 1
  return parents, jnp.asarray(anc), jnp.asarray(depth)


def _path(parents, i):
  out = []
  while i >= 0:
    out.append(i)
    i = parents[i]
  return out[::-1]


def test_tree_mask_decoding_equals_full_forward_along_each_path(small_model):
  parents, anc, depth = _tree()
  prefix = _rand_tokens(3, 1, 6)
  tree_toks = _rand_tokens(4, 1, len(parents))
  cache = commit(small_model(prefix, init_cache(small_model.cfg, 1, 24)).cache, jnp.array([6]))
  out = small_model(tree_toks, cache, tree_mask_TxT=anc, depth_T=depth)
  for node in range(len(parents)):
    seq = jnp.concatenate([prefix, tree_toks[:, _path(parents, node)]], axis=1)
    ref = small_model(seq).logits_BxTxV[:, -1]
    np.testing.assert_allclose(out.logits_BxTxV[:, node], ref, atol=1e-5)


def test_causality_future_tokens_do_not_change_past_logits(small_model):
  a = _rand_tokens(5, 1, 12)
  b = a.at[:, 8:].set(_rand_tokens(6, 1, 4))
  np.testing.assert_allclose(small_model(a).logits_BxTxV[:, :8],
                             small_model(b).logits_BxTxV[:, :8], atol=1e-6)
  assert not np.allclose(small_model(a).logits_BxTxV[:, 8:], small_model(b).logits_BxTxV[:, 8:])


def test_gqa_equals_mha_with_repeated_kv_heads():
  gqa = init_model(small_config(n_heads=4, n_kv_heads=2, family="qwen2"), seed=3)
  mha = init_model(small_config(n_heads=4, n_kv_heads=4, family="qwen2"), seed=4)
  h = gqa.cfg.hd
  nq, nk = 4 * h, 2 * h
  repeat = lambda w: jnp.repeat(w.reshape(*w.shape[:-1], 2, h), 2, axis=-2).reshape(
      *w.shape[:-1], -1)
  for lg, lm in zip(gqa.layers, mha.layers):
    for name in ("kernel", "bias"):  # q as is, each kv head's k and v columns repeated twice
      w = getattr(lg.attn.qkv_proj, name)[...]
      getattr(lm.attn.qkv_proj, name)[...] = jnp.concatenate(
          [w[..., :nq], repeat(w[..., nq:nq + nk]), repeat(w[..., nq + nk:])], axis=-1)
    lm.attn.o_proj = lg.attn.o_proj
    lm.input_norm, lm.post_attn_norm, lm.mlp = lg.input_norm, lg.post_attn_norm, lg.mlp
  mha.embed, mha.final_norm = gqa.embed, gqa.final_norm
  toks = _rand_tokens(7, 2, 10)
  np.testing.assert_allclose(gqa(toks).logits_BxTxV, mha(toks).logits_BxTxV, atol=1e-5)


def _half_to_interleaved(w_DxNH, n, h):
  """Permutes q/k output features so that interleaved RoPE computes what rotate-half did."""
  w = w_DxNH.reshape(-1, n, 2, h // 2)
  return jnp.swapaxes(w, 2, 3).reshape(w_DxNH.shape)


def test_interleaved_rope_with_permuted_weights_equals_half_rope():
  half = init_model(small_config(rope_layout="half"), seed=5)
  inter = init_model(small_config(rope_layout="interleaved"), seed=6)
  cfg = half.cfg
  nnx.update(inter, nnx.state(half))
  for lh, li in zip(half.layers, inter.layers):
    w = lh.attn.qkv_proj.kernel[...]
    nq, nk = cfg.n_heads * cfg.hd, cfg.n_kv_heads * cfg.hd
    li.attn.qkv_proj.kernel[...] = jnp.concatenate(
        [_half_to_interleaved(w[:, :nq], cfg.n_heads, cfg.hd),
         _half_to_interleaved(w[:, nq:nq + nk], cfg.n_kv_heads, cfg.hd), w[:, nq + nk:]], axis=1)
  toks = _rand_tokens(8, 2, 10)
  np.testing.assert_allclose(half(toks).logits_BxTxV, inter(toks).logits_BxTxV, atol=1e-5)
  # And the layouts really differ without the permutation.
  plain = init_model(small_config(rope_layout="interleaved"), seed=6)
  nnx.update(plain, nnx.state(half))
  assert not np.allclose(half(toks).logits_BxTxV, plain(toks).logits_BxTxV, atol=1e-3)


def test_return_layers_gives_every_layer_output(small_model):
  out = small_model(_rand_tokens(9, 1, 5), return_layers=True)
  assert len(out.layers) == small_model.cfg.n_layers + 1
  np.testing.assert_allclose(small_model.final_norm(out.layers[-1]), out.hidden_BxTxD, atol=1e-6)


def test_untied_head_and_jit_with_weights_as_arguments():
  model = init_model(small_config(tie_embeddings=False), seed=1)
  graphdef, state = nnx.split(model)

  @jax.jit
  def f(state, toks):
    return nnx.merge(graphdef, state)(toks).logits_BxTxV

  toks = _rand_tokens(10, 1, 6)
  np.testing.assert_allclose(f(state, toks), model(toks).logits_BxTxV, atol=1e-6)
  state2 = jax.tree.map(lambda x: x * 1.01, state)
  assert not np.allclose(f(state2, toks), f(state, toks))


def test_bad_config_values_are_clear_errors():
  with pytest.raises(ValueError, match="multiple of n_kv_heads"):
    small_config(n_heads=4, n_kv_heads=3)
  with pytest.raises(ValueError, match="rope_layout"):
    small_config(rope_layout="weird")
  with pytest.raises(ValueError, match="Unknown model family 'gpt2'; known families"):
    small_config(family="gpt2")
  with pytest.raises(ValueError, match="Unknown model preset"):
    from tlt_jax.models import get_preset
    get_preset("nope")


@pytest.mark.parametrize("use_bias", [False, True])
def test_fused_linear_is_separately_initialised_projections_side_by_side(use_bias):
  kw = dict(kernel_init=nnx.initializers.normal(0.02), param_dtype=jnp.float32,
            dtype=jnp.float32)
  fused = fused_linear(8, (4, 2, 2), use_bias=use_bias, rngs=nnx.Rngs(3), **kw)
  rngs = nnx.Rngs(3)
  parts = [nnx.Linear(8, w, use_bias=use_bias, rngs=rngs, **kw) for w in (4, 2, 2)]
  np.testing.assert_array_equal(fused.kernel[...],
                                jnp.concatenate([p.kernel[...] for p in parts], axis=1))
  x = jax.random.normal(jax.random.key(1), (3, 8))
  np.testing.assert_allclose(fused(x), jnp.concatenate([p(x) for p in parts], -1), atol=1e-6)
