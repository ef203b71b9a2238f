"""The attention seam: the Pallas path (interpreted on CPU) equals the XLA path over ragged
cache lengths, GQA ratios, chain and tree masks; it lowers for the GPU's Triton backend; and
speculative decoding through it gives the tokens of the XLA path."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.conftest import lower_for_gpu, small_config
from tests.drafter.test_drafter import STOPS, TREE, _trained_drafter
from tests.spec.test_spec_engine import _prompts, peaked_model
from tlt_jax.drafter.proposer import as_proposer
from tlt_jax.kernels.attention import Prefix, attention, cache_slots, resolve_impl, to_cache_layout
from tlt_jax.kernels.prefix_pallas import prefix_attention, tiling
from tlt_jax.models import commit, init_cache, init_model
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.spec.strategy import SpecConfig, Strategy


def _case(b, t, kh, g, h, s, tree, seed=0):
  """Random queries, new keys/values and a cache of `s` slots whose rows' lengths include 0
  and the cache's end (`s - t`: the new tokens fill the last slots)."""
  rng = np.random.default_rng(seed)
  f32 = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
  lengths = np.r_[0, s - t, rng.integers(0, s - t + 1, size=b - 2)].astype(np.int32)
  mask = np.tril(np.ones((t, t), bool))
  if tree:  # each token sees the root, itself and a random subset of the tokens before it
    mask &= rng.random((t, t)) < 0.5
    mask |= np.eye(t, dtype=bool)
    mask[:, 0] = True
  return (f32(b, t, kh * g, h), f32(b, t, kh, h), f32(b, t, kh, h), f32(b, s, kh, h),
          f32(b, s, kh, h), jnp.asarray(lengths), jnp.broadcast_to(jnp.asarray(mask), (b, t, t)))


@pytest.mark.parametrize("g", [1, 3, 8])
@pytest.mark.parametrize("t,tree", [(1, False), (4, False), (8, False), (4, True), (8, True)])
def test_the_pallas_path_equals_the_xla_path(g, t, tree):
  q, k_new, v_new, k_cache, v_cache, lengths, mask = _case(4, t, 2, g, 32, 96, tree, seed=g + t)
  ref = attention(q, k_new, v_new, mask,
                  Prefix(*to_cache_layout(k_cache, v_cache, "xla"), lengths, "xla"))
  out = attention(q, k_new, v_new, mask,
                  Prefix(*to_cache_layout(k_cache, v_cache, "pallas"), lengths, "pallas"))
  np.testing.assert_allclose(out, ref, atol=1e-5, rtol=0)
  # The slots past a row's length are never read: changing them changes nothing.
  garbage = jnp.where(jnp.arange(96)[None, :, None, None] >= lengths[:, None, None, None],
                      1e3, k_cache)
  again = attention(q, k_new, v_new, mask,
                    Prefix(*to_cache_layout(garbage, v_cache, "pallas"), lengths, "pallas"))
  np.testing.assert_array_equal(again, out)


def test_the_tiling_covers_every_slot_in_whole_tiles():
  assert tiling(96) == (32, 3) and tiling(16) == (16, 1) and tiling(1024) == (64, 8)
  assert cache_slots(97, "pallas") == 112 and cache_slots(97, "xla") == 97
  with pytest.raises(ValueError, match="multiple of 16 slots"):
    tiling(40)


def test_an_unknown_or_unsupported_implementation_is_one_line():
  assert resolve_impl("auto", "cpu") == "xla" and resolve_impl("auto", "gpu") == "pallas"
  with pytest.raises(ValueError, match="Unknown attention implementation 'flash'"):
    resolve_impl("flash", "cpu")
  with pytest.raises(ValueError, match="targets GPUs"):
    resolve_impl("pallas", "tpu")
  with pytest.raises(ValueError, match="attention must be 'auto', 'xla' or 'pallas'"):
    EngineConfig(attention="flash")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_kernel_and_a_decode_step_lower_for_the_gpu_triton_backend(dtype):
  """Lowering, not compiling: Pallas turns the kernel into Triton IR here, without a GPU, so
  an operation or tile shape Triton cannot take fails on this machine."""
  kernel = functools.partial(prefix_attention, interpret=False)
  args = (jax.ShapeDtypeStruct((8, 2, 24, 64), dtype), jax.ShapeDtypeStruct((8, 2, 512, 64), dtype),
          jax.ShapeDtypeStruct((8, 2, 512, 64), dtype), jax.ShapeDtypeStruct((8,), jnp.int32))
  text = lower_for_gpu(jax.jit(kernel), *args)
  assert "xla.gpu.triton" in text and "mosaic" not in text

  cfg = small_config(d_model=128, dtype=jnp.dtype(dtype).name)  # head_dim 32: a Triton tile
  graphdef, weights = nnx.split(init_model(cfg))
  step = jax.jit(lambda w, c, tok: nnx.merge(graphdef, w)(tok, c).logits_BxTxV)
  text = lower_for_gpu(step, weights, init_cache(cfg, 4, 64, impl="pallas"),
                       jnp.zeros((4, 3), jnp.int32))
  assert "xla.gpu.triton" in text  # every layer calls the one lowered kernel


def test_a_pallas_cache_decodes_and_commits_tree_paths_as_the_xla_cache_does():
  model = init_model(small_config())
  tokens = jax.random.randint(jax.random.key(0), (3, 12), 0, small_config().vocab_size)
  tree = jnp.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], bool)
  # Each forward jitted: eagerly, every op of the interpreted kernel would build its own program.
  def forward(m, t, c, d, tr):  # (logits, cache)
    out = m(t, c, depth_T=d, tree_mask_TxT=tr)
    return out.logits_BxTxV, out.cache
  forward = nnx.jit(forward)
  outs = {}
  for impl in ("xla", "pallas"):
    cache = init_cache(model.cfg, 3, 40, impl=impl)
    _, cache = forward(model, tokens[:, :8], cache, None, None)
    cache = commit(cache, jnp.array([8, 5, 2]))
    _, cache = forward(model, tokens[:, 8:], cache, jnp.array([0, 1, 1, 2]), tree)
    cache = commit(cache, jnp.array([3, 1, 2]), jnp.array([[0, 2, 3], [0, 2, 3], [0, 1, 3]]))
    outs[impl] = forward(model, tokens[:, :2], cache, None, None)[0]
  np.testing.assert_allclose(outs["pallas"], outs["xla"], atol=1e-5, rtol=0)


def _generate(model, drafter, params, impl, key, spec=True, buckets=(4, 8)):
  """Rollouts of 4 prompts x 2 through `impl`, speculative (an EAGLE chain and a tree arm) or,
  with `spec=False`, plain; the 8 rows compact to 4 unless `buckets` is one bucket."""
  sd = SpecConfig(threshold=8, rule="coupled", arms=(Strategy("eagle", depth=3), TREE[0]),
                  min_accept_len=0.0)
  eng = RolloutEngine(model, EngineConfig(batch_buckets=buckets, max_batch=8, steps_per_dispatch=3,
                                          precompile=False, attention=impl),
                      spec=sd if spec else None, drafter=as_proposer(drafter) if spec else None)
  return eng.generate(_prompts(4, seed=5), 2, params, jax.random.key(key)), eng


@pytest.mark.long
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_speculative_decoding_through_the_pallas_path_gives_plain_xla_decoding_s_tokens(
    temperature):
  """Against plain decoding through XLA: the kernel's verify and tree masks lose nothing (and
  the reference builds no speculative programs, the dearest here)."""
  target = peaked_model(scale=8.0)
  drafter = _trained_drafter(target)[0]
  params = SamplingParams(temperature=temperature, max_new_tokens=16, stop_tokens=STOPS)
  # Greedy compacts the cache kernel's rows; sampling runs one bucket (half the programs).
  buckets = (4, 8) if temperature == 0.0 else (8,)
  ref, _ = _generate(target, drafter, params, "xla", key=3, spec=False, buckets=buckets)
  out, eng = _generate(target, drafter, params, "pallas", key=3, buckets=buckets)
  assert eng.attention == "pallas"
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)
  assert eng.spec.accept_len() > 1.1  # drafts were verified through the kernel
