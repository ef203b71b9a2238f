"""KV cache: accepted prefixes and tree paths, overflow errors."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.conftest import jit_forward
from tlt_jax.kernels.attention import KEY_SLOT_AXIS
from tlt_jax.models import CacheOverflowError, check_overflow, commit, init_cache
from tlt_jax.models.precision import Precision


def _valid_equal(c1, c2):
  np.testing.assert_array_equal(c1.lengths_B, c2.lengths_B)
  for b, n in enumerate(np.asarray(c1.lengths_B)):
    for a, z in zip(c1.k, c2.k):  # [B, K, H, S]
      np.testing.assert_allclose(a[b, ..., :n], z[b, ..., :n], atol=1e-6)
    for a, z in zip(c1.v, c2.v):  # [B, K, S, H]
      np.testing.assert_allclose(a[b, :, :n], z[b, :, :n], atol=1e-6)


def _prefilled(model, toks, n):
  return commit(jit_forward(model, toks, init_cache(model.cfg, toks.shape[0], 20)).cache,
                jnp.full((toks.shape[0],), n))


def test_keeping_an_accepted_prefix_equals_writing_only_that_prefix(small_model):
  toks = jax.random.randint(jax.random.key(0), (2, 10), 3, 53)
  cache = _prefilled(small_model, toks[:, :4], 4)
  n_accept = jnp.array([2, 5])
  kept = commit(jit_forward(small_model, toks[:, 4:10], cache).cache, n_accept)
  for b in range(2):
    n = int(n_accept[b])
    row = jax.tree.map(lambda x: x[b:b + 1], cache)
    ref = commit(jit_forward(small_model, toks[b:b + 1, 4:4 + n], row).cache, jnp.array([n]))
    _valid_equal(jax.tree.map(lambda x: x[b:b + 1], kept), ref)


def test_keeping_a_tree_path_equals_writing_the_path(small_model):
  # Chain 0 -> 2 -> 3 in a tree where node 1 is a sibling of node 2.
  parents = [-1, 0, 0, 2]
  anc = jnp.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], bool)
  depth = jnp.array([0, 1, 1, 2])
  toks = jax.random.randint(jax.random.key(1), (1, 8), 3, 53)
  cache = _prefilled(small_model, toks[:, :4], 4)
  tree = toks[:, 4:8]
  out = jit_forward(small_model, tree, cache, tree_mask_TxT=anc, depth_T=depth)
  kept = commit(out.cache, jnp.array([3]), accept_idx_BxA=jnp.array([[0, 2, 3, 1]]))
  path = tree[:, jnp.array([0, 2, 3])]
  ref = commit(jit_forward(small_model, path, cache).cache, jnp.array([3]))
  _valid_equal(kept, ref)
  assert parents  # documented structure


@pytest.mark.parametrize("impl", ["xla", "pallas", "invariant"])
@pytest.mark.parametrize("rows", [3, 9])  # written row by row, and batched
def test_a_tree_commit_moves_the_kept_slots_and_touches_no_other(small_model, impl, rows):
  """Each row's kept path lands in the slots after its length and every other slot keeps its
  value: also where the path is longer than the tree written (the last row, at the cache's
  end) and where nothing is kept (the first row)."""
  rng = np.random.default_rng(0)
  cache = init_cache(small_model.cfg, rows, 64, impl=impl)
  slots, slot_axis = cache.max_len, KEY_SLOT_AXIS[impl]
  lengths = rng.integers(0, slots - 6, rows)
  lengths[-1] = slots - 3  # a tree of 3 written at the end, a path of 5
  noise = lambda xs: tuple(jnp.asarray(rng.standard_normal(x.shape), x.dtype) for x in xs)
  cache = cache.replace(k=noise(cache.k), v=noise(cache.v),
                        lengths_B=jnp.asarray(lengths, jnp.int32))
  path = rng.integers(0, 3, (rows, 5))
  n_accept = rng.integers(1, 4, rows)
  n_accept[0] = 0
  kept = jax.jit(commit)(cache, jnp.asarray(n_accept), jnp.asarray(path, jnp.int32))
  np.testing.assert_array_equal(kept.lengths_B, lengths + n_accept)
  for before, after, axis in [*((k, kk, slot_axis) for k, kk in zip(cache.k, kept.k)),
                              *((v, vv, 2) for v, vv in zip(cache.v, kept.v))]:
    want = np.moveaxis(np.array(before), axis, 1)  # [B, S, ...]
    for b in range(rows):
      src = want[b, lengths[b] + path[b, :n_accept[b]]].copy()
      want[b, lengths[b]:lengths[b] + n_accept[b]] = src
    np.testing.assert_array_equal(np.moveaxis(np.asarray(after), axis, 1), want)


def test_write_past_end_raises_eagerly(small_model):
  cache = init_cache(small_model.cfg, 1, 8)
  cache = commit(small_model(jnp.ones((1, 6), jnp.int32), cache).cache, jnp.array([6]))
  with pytest.raises(CacheOverflowError, match="past its end"):
    small_model(jnp.ones((1, 3), jnp.int32), cache)


def test_write_past_end_under_jit_is_flagged_and_raises_at_sync(small_model):
  graphdef, state = nnx.split(small_model)

  @jax.jit
  def step(state, cache, toks):
    return nnx.merge(graphdef, state)(toks, cache).cache

  cache = commit(step(state, init_cache(small_model.cfg, 2, 8), jnp.ones((2, 6), jnp.int32)),
                 jnp.array([6, 4]))
  cache = step(state, cache, jnp.ones((2, 3), jnp.int32))
  np.testing.assert_array_equal(cache.overflow_B, [True, False])
  with pytest.raises(CacheOverflowError, match="rows \\[0\\]"):
    check_overflow(cache)


@pytest.mark.parametrize("batch,tokens,dtype", [(1, 1, "float32"), (3, 4, "float32"),
                                                (3, 1, "bfloat16"), (9, 4, "bfloat16")])
def test_a_cached_step_updates_the_donated_cache_in_place(small_model, batch, tokens, dtype):
  """No layer's cache is copied by a decode or verify step, whether its rows write one by one
  (3) or in one batched update (9): the compiled step holds no `copy` of a cache buffer (the
  cache is a few times the weights' bytes at long contexts; read before the write, a batched
  write ran on copies), and a bfloat16 cache is not written through a float32 copy (jax 0.10's
  XLA:CPU wrote one so)."""
  model = Precision(param_dtype=dtype, compute_dtype=dtype).apply(small_model)
  graphdef, state = nnx.split(model)

  def step(state, cache, toks):
    out = nnx.merge(graphdef, state)(toks, cache)
    return out.logits_BxTxV, commit(out.cache, jnp.ones((batch,), jnp.int32))

  cache = init_cache(model.cfg, batch, 64)
  hlo = jax.jit(step, donate_argnums=1).lower(
      state, cache, jnp.ones((batch, tokens), jnp.int32)).compile().as_text()
  shapes = "|".join(re.escape(",".join(map(str, x.shape)) + "]") for x in (cache.k[0], cache.v[0]))
  copies = [line for line in hlo.splitlines()
            if re.search(r"= [a-z0-9]+\[(%s)\{[0-9,]*\} copy\(" % shapes, line)]
  assert not copies, copies[:3]
  wide = [line for line in hlo.splitlines()
          if re.search(r"= f32\[(%s)\{[0-9,]*\} (dynamic-update-slice|scatter)\(" % shapes, line)]
  assert dtype == "float32" or not wide, wide[:3]
