"""Model correctness: cache decoding equals the full forward; GQA; RoPE layouts; causality."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.conftest import jit_forward, small_config
from tlt_jax.models import commit, init_cache, init_model
from tlt_jax.models.weights import assign, export, permute_rope_rows


def _rand_tokens(key, b, t, v=53):
  return jax.random.randint(jax.random.key(key), (b, t), 3, v)


def test_cache_one_token_at_a_time_equals_full_forward_with_ragged_prompts(small_model):
  toks = _rand_tokens(1, 3, 20)
  full = jit_forward(small_model, toks)
  prompt_lens = jnp.array([5, 9, 3])
  cache = init_cache(small_model.cfg, 3, 32)
  out = jit_forward(small_model, toks[:, :9], cache)  # padded prefill; rows commit their own length
  cache = commit(out.cache, prompt_lens)
  for b in range(3):
    np.testing.assert_allclose(out.logits_BxTxV[b, : prompt_lens[b]],
                               full.logits_BxTxV[b, : prompt_lens[b]], atol=1e-5)
  # Each row continues from its own length with its own true next tokens.
  for _ in range(8):
    pos = cache.lengths_B
    step_toks = jnp.take_along_axis(toks, pos[:, None], axis=1)
    out = jit_forward(small_model, step_toks, cache)
    cache = commit(out.cache, jnp.ones(3, jnp.int32))
    want = jnp.take_along_axis(full.logits_BxTxV, pos[:, None, None], axis=1)
    np.testing.assert_allclose(out.logits_BxTxV, want, atol=1e-5)
    want_h = jnp.take_along_axis(full.hidden_BxTxD, pos[:, None, None], axis=1)
    np.testing.assert_allclose(out.hidden_BxTxD, want_h, atol=1e-5)


def test_cache_many_tokens_at_once_equals_full_forward(small_model):
  toks = _rand_tokens(2, 2, 16)
  full = jit_forward(small_model, toks)
  cache = commit(jit_forward(small_model, toks[:, :6], init_cache(small_model.cfg, 2, 24)).cache,
                 jnp.array([6, 6]))
  out = jit_forward(small_model, toks[:, 6:11], cache)
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
  cache = commit(jit_forward(small_model, prefix, init_cache(small_model.cfg, 1, 24)).cache,
                 jnp.array([6]))
  out = jit_forward(small_model, tree_toks, cache, tree_mask_TxT=anc, depth_T=depth)
  for node in range(len(parents)):
    seq = jnp.concatenate([prefix, tree_toks[:, _path(parents, node)]], axis=1)
    ref = jit_forward(small_model, seq).logits_BxTxV[:, -1]
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
  tensors = export(gqa, gqa.cfg)
  for name in list(tensors):  # each kv head's k and v rows (and biases) repeated twice
    if ".k_proj." in name or ".v_proj." in name:
      w = tensors[name]
      tensors[name] = np.repeat(w.reshape(2, h, *w.shape[1:]), 2, axis=0).reshape(
          4 * h, *w.shape[1:])
  assign(mha, tensors, mha.cfg, "test")
  toks = _rand_tokens(7, 2, 10)
  np.testing.assert_allclose(gqa(toks).logits_BxTxV, mha(toks).logits_BxTxV, atol=1e-5)


def test_interleaved_rope_with_permuted_weights_equals_half_rope():
  half = init_model(small_config(rope_layout="half"), seed=5)
  inter = init_model(small_config(rope_layout="interleaved"), seed=6)
  cfg = half.cfg
  tensors = export(half, cfg)
  for name in list(tensors):
    heads = cfg.n_heads if ".q_proj." in name else cfg.n_kv_heads if ".k_proj." in name else 0
    if heads:
      tensors[name] = permute_rope_rows(tensors[name], heads, cfg.hd, to="interleaved")
  assign(inter, tensors, cfg, "test")
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


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_seed_gives_the_model_of_separately_initialised_projections(family):
  """The fused, head-major kernels hold what one `nnx.Linear` per projection would draw, in the
  order q, k, v, o, gate, up, down per layer (and the layout of the kernels leaves it alone)."""
  cfg = small_config(family=family, tie_embeddings=False)
  model = init_model(cfg, seed=3)
  rngs = nnx.Rngs(3)
  kw = dict(kernel_init=nnx.initializers.normal(0.02), rngs=rngs)
  want = {"model.embed_tokens.weight": nnx.Embed(
      cfg.vocab_size, cfg.d_model, embedding_init=nnx.initializers.normal(0.02),
      rngs=rngs).embedding[...]}
  h, bias = cfg.hd, cfg.qkv_bias
  for i in range(cfg.n_layers):
    p = f"model.layers.{i}."
    for name, (d_in, d_out), b in [
        ("self_attn.q_proj", (cfg.d_model, cfg.n_heads * h), bias),
        ("self_attn.k_proj", (cfg.d_model, cfg.n_kv_heads * h), bias),
        ("self_attn.v_proj", (cfg.d_model, cfg.n_kv_heads * h), bias),
        ("self_attn.o_proj", (cfg.n_heads * h, cfg.d_model), False),
        ("mlp.gate_proj", (cfg.d_model, cfg.d_ff), False),
        ("mlp.up_proj", (cfg.d_model, cfg.d_ff), False),
        ("mlp.down_proj", (cfg.d_ff, cfg.d_model), False)]:
      lin = nnx.Linear(d_in, d_out, use_bias=b, **kw)
      want[p + name + ".weight"] = lin.kernel[...].T
      if b:
        want[p + name + ".bias"] = lin.bias[...]
  want["lm_head.weight"] = nnx.Linear(cfg.d_model, cfg.vocab_size, use_bias=False,
                                      **kw).kernel[...].T
  got = export(model, cfg)
  for name, w in want.items():
    np.testing.assert_array_equal(got[name], np.asarray(w), err_msg=name)
  assert bias == any(n.endswith(".bias") for n in got)


def test_qkv_kernel_is_head_major():
  """Each kv head's slice of `qkv_proj` holds its own query heads, key and value: what lets
  `tp` split the kernel over kv heads."""
  cfg = small_config(n_heads=4, n_kv_heads=2)
  model = init_model(cfg, seed=1)
  tensors, h = export(model, cfg), cfg.hd
  kernel = np.asarray(model.layers[0].attn.qkv_proj.kernel[...])
  assert kernel.shape == (cfg.d_model, 2, 4, h)
  q = tensors["model.layers.0.self_attn.q_proj.weight"]  # [N H, D]
  k = tensors["model.layers.0.self_attn.k_proj.weight"]
  for kv in range(2):
    np.testing.assert_array_equal(kernel[:, kv, :2].reshape(cfg.d_model, -1).T,
                                  q[kv * 2 * h:(kv + 1) * 2 * h])
    np.testing.assert_array_equal(kernel[:, kv, 2].T, k[kv * h:(kv + 1) * h])
