"""Invariant numerics: a position's logits and hidden states are bitwise the same in every call
that computes them (exact `==`, float32 and bfloat16, CPU)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.conftest import jit_forward, small_config
from tests.test_launchers import last_json, run_module
from tlt_jax.drafter.model import drafter_cache
from tlt_jax.drafter.warmup import target_fingerprint
from tlt_jax.models import init_model, invariant
from tlt_jax.models import kv_cache as kvc

ROWS, LENGTH = 8, 24
_CACHED_CALLS = {}


def _cached_call(model, tokens, cache):
  """A call on a cache, compiled once for each `invariant.LIVE_BYTES` and `KERNEL` (which its
  trace reads)."""
  setting = (invariant.LIVE_BYTES, invariant.KERNEL)
  call = _CACHED_CALLS.setdefault(setting, nnx.jit(lambda m, x, c: m(x, c)))
  return call(model, tokens, cache)


def _model(dtype: str, numerics: str):
  # 4 query heads over 1 kv head: a decode step's attention has 4 query rows, a verify of 4 has
  # 16; heads of 64 (SmolLM2's, Llama's: there XLA:CPU computes a product of a few query rows
  # otherwise than one of many, which heads of 8 hide)
  return init_model(small_config(n_heads=4, n_kv_heads=1, head_dim=64, dtype=dtype,
                                 numerics=numerics, max_seq_len=96), seed=0)


def _tokens(cfg):
  return np.random.default_rng(0).integers(0, cfg.vocab_size, (ROWS, LENGTH))


def _cached(model, tokens, rows, chunks, slots=96):
  """Logits and hidden states of `tokens[rows]` fed to a cache `chunks` tokens at a time (a
  prefill, then decode steps and chain verifies), each chunk committed whole."""
  cache = kvc.init_cache(model.cfg, len(rows), slots)
  logits, hidden, at = [], [], 0
  for n in chunks:
    out = _cached_call(model, jnp.asarray(tokens[rows, at:at + n]), cache)
    cache = kvc.commit(out.cache, jnp.full((len(rows),), n))
    logits.append(np.asarray(out.logits_BxTxV))
    hidden.append(np.asarray(out.hidden_BxTxD))
    at += n
  return np.concatenate(logits, axis=1), np.concatenate(hidden, axis=1)


# (rows, chunks): prefill then decode steps, alone and among 7 other rows; verifies of 4 and 9;
# another prefill length, another row count and a cache of another size.
CALLS = [(list(range(ROWS)), [8] + [1] * 16, 96), ([3], [8] + [1] * 16, 96),
         (list(range(ROWS)), [8, 4, 4, 4, 4], 96), ([0, 5, 6], [6, 9, 1, 4, 4], 96),
         ([2, 7], [24], 40)]


@pytest.mark.parametrize("head_dim", [8, 64])
def test_attention_gives_a_query_row_the_same_numbers_in_every_call(head_dim, monkeypatch):
  """The attention alone, float32: a query's output is bitwise the same among all 48 queries of a
  full forward, in a decode step or a chain verify of 4 (alone or beside another row) and over
  a longer cache whose extra slots it does not see, and reading only the key blocks that hold
  the slots it sees (`live_slots`, as a call on a cache does)."""
  rng = np.random.default_rng(0)
  b, kh, g, s = 2, 3, 3, 128
  q = jnp.asarray(rng.standard_normal((b, 48, kh * g, head_dim)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((b, kh, head_dim, 192)), jnp.float32)  # [B, K, H, S]
  v = jnp.asarray(rng.standard_normal((b, kh, 192, head_dim)), jnp.float32)  # [B, K, S, H]
  visible = jnp.asarray(np.tril(np.ones((48, 192), bool), k=40)[None].repeat(b, 0))
  monkeypatch.setattr(invariant, "LIVE_BYTES", 0)  # every call given `live_slots` switches
  call = jax.jit(invariant.attention)
  full = np.asarray(call(q, k[..., :s], v[:, :, :s], visible[..., :s]))
  for rows, start, t, slots in [((0, 1), 40, 1, s), ((1,), 44, 1, s), ((0, 1), 40, 4, s),
                                ((0,), 43, 4, 192), ((0, 1), 10, 4, 192)]:
    r = np.asarray(rows)
    for live in (None, start + t + 40):  # query i sees slots up to i + 40: 1 or 2 blocks
      got = call(q[r, start:start + t], k[r, ..., :slots], v[r, :, :slots],
                 visible[r, start:start + t, :slots], live)
      np.testing.assert_array_equal(np.asarray(got), full[r, start:start + t],
                                    err_msg=f"{rows} {start} {t} {slots} {live}")


@pytest.mark.parametrize("dtype,live_bytes", [("float32", None), ("bfloat16", None),
                                              ("float32", 0), ("bfloat16", 0)])
def test_a_position_is_computed_alike_by_every_call(dtype, live_bytes, monkeypatch):
  """Each of `CALLS` against the full forward; with `live_bytes` 0 every call on a cache reads
  its live key blocks alone (as SmolLM2's from 8 rows over 512 slots)."""
  if live_bytes is not None:
    monkeypatch.setattr(invariant, "LIVE_BYTES", live_bytes)
  model = _model(dtype, "invariant")
  tokens = _tokens(model.cfg)
  full = jit_forward(model, jnp.asarray(tokens))
  want_logits, want_hidden = np.asarray(full.logits_BxTxV), np.asarray(full.hidden_BxTxD)
  alone = jit_forward(model, jnp.asarray(tokens[4:5]))
  np.testing.assert_array_equal(np.asarray(alone.logits_BxTxV), want_logits[4:5])
  for rows, chunks, slots in CALLS:
    logits, hidden = _cached(model, tokens, rows, chunks, slots)
    np.testing.assert_array_equal(logits, want_logits[rows], err_msg=f"{rows} {chunks}")
    np.testing.assert_array_equal(hidden, want_hidden[rows], err_msg=f"{rows} {chunks}")


# A tree of 7 nodes after a prefix of 62: the path 0 -> 2 -> 4 -> 6 holds the sequence's next
# four tokens; nodes 1, 3 and 5 are other branches, written between the path's nodes, so node 2
# (position 63) is written in the second key block (slot 64).
TREE_PARENTS = [-1, 0, 0, 1, 2, 2, 4]
TREE_PATH = [0, 2, 4, 6]


def _tree_mask_and_depth(parents):
  n = len(parents)
  mask, depth = np.zeros((n, n), bool), np.zeros(n, np.int32)
  for i, p in enumerate(parents):
    mask[i, i] = True
    if p >= 0:
      mask[i] |= mask[p]
      depth[i] = depth[p] + 1
  return jnp.asarray(mask), jnp.asarray(depth)


@pytest.mark.parametrize("dtype,live_bytes", [("float32", None), ("bfloat16", None),
                                              ("bfloat16", 0)])
def test_a_tree_verify_computes_each_node_as_the_chain_it_ends(dtype, live_bytes, monkeypatch):
  """A tree verify writes its nodes at their index among the tree's nodes, not at their depth;
  in invariant numerics each node still comes out bitwise as the full forward computes the
  position it ends, on the path and off it (with `live_bytes` 0, reading live blocks alone)."""
  if live_bytes is not None:
    monkeypatch.setattr(invariant, "LIVE_BYTES", live_bytes)
  model = _model(dtype, "invariant")
  rng = np.random.default_rng(1)
  tokens = rng.integers(0, model.cfg.vocab_size, (ROWS, 66))
  full = jit_forward(model, jnp.asarray(tokens))
  mask, depth = _tree_mask_and_depth(TREE_PARENTS)
  nodes = rng.integers(0, model.cfg.vocab_size, (ROWS, len(TREE_PARENTS)))
  nodes[:, TREE_PATH] = tokens[:, 62:]
  cache = kvc.init_cache(model.cfg, ROWS, 96)
  cache = kvc.commit(_cached_call(model, jnp.asarray(tokens[:, :62]), cache).cache,
                     jnp.full((ROWS,), 62))
  out = nnx.jit(lambda m, x, c: m(x, c, depth_T=depth, tree_mask_TxT=mask))(
      model, jnp.asarray(nodes), cache)
  np.testing.assert_array_equal(np.asarray(out.logits_BxTxV)[:, TREE_PATH],
                                np.asarray(full.logits_BxTxV)[:, 62:])
  np.testing.assert_array_equal(np.asarray(out.hidden_BxTxD)[:, TREE_PATH],
                                np.asarray(full.hidden_BxTxD)[:, 62:])
  # node 3 ends the chain tokens[:62], nodes[0], nodes[1], nodes[3]
  branch = np.concatenate([tokens[:, :62], nodes[:, [0, 1, 3]]], axis=1)
  want = np.asarray(jit_forward(model, jnp.asarray(branch)).logits_BxTxV)[:, -1]
  np.testing.assert_array_equal(np.asarray(out.logits_BxTxV)[:, 3], want)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fast_numerics_differ_by_rounding_only_and_the_test_above_would_see_it(dtype):
  """Decode steps in "fast" numerics: close to the full forward (rounding), not bitwise equal, so
  the exact test above has the power to fail."""
  model = _model(dtype, "fast")
  tokens = _tokens(model.cfg)
  want = np.asarray(jit_forward(model, jnp.asarray(tokens)).logits_BxTxV)
  differ = 0
  for rows, chunks, slots in CALLS[:2]:
    logits, _ = _cached(model, tokens, rows, chunks, slots)
    np.testing.assert_allclose(logits, want[rows], atol=0.05 if dtype == "bfloat16" else 1e-5)
    differ += int(not np.array_equal(logits, want[rows]))
  assert differ > 0


def test_invariant_numerics_are_the_same_model():
  """Invariant and fast numerics compute the same function (float32 logits within rounding) and
  are the same policy to a drafter's key."""
  fast, inv = _model("float32", "fast"), _model("float32", "invariant")
  assert target_fingerprint(fast) == target_fingerprint(inv)
  tokens = jnp.asarray(_tokens(fast.cfg))
  np.testing.assert_allclose(np.asarray(jit_forward(inv, tokens).logits_BxTxV),
                             np.asarray(jit_forward(fast, tokens).logits_BxTxV), atol=1e-5)


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_an_invariant_model_s_cache_is_laid_out_for_its_attention_whatever_the_engine_asks(impl):
  """Keys `[B, K, H, S]` and values `[B, K, S, H]` in whole key blocks (its attention reads them
  in place); its drafter's cache in the layout asked for; a cache of another layout is refused in
  one line."""
  cfg = _model("float32", "invariant").cfg
  cache = kvc.init_cache(cfg, 2, 70, impl=impl)
  slots = 2 * invariant.KEY_BLOCK
  assert cache.impl == "invariant" and cache.max_len == slots
  assert cache.k[0].shape == (2, cfg.n_kv_heads, cfg.hd, slots)
  assert cache.v[0].shape == (2, cfg.n_kv_heads, slots, cfg.hd)
  assert drafter_cache(cfg, 2, 70, impl).impl == impl
  model = _model("float32", "invariant")
  wrong = kvc.init_cache(model.cfg.replace(numerics="fast"), 2, 70, impl=impl)
  with pytest.raises(ValueError, match="invariant numerics reads a cache in the 'invariant'"):
    model(jnp.zeros((2, 1), jnp.int32), wrong)


@pytest.mark.parametrize("numerics", ["fast", "invariant"])
@pytest.mark.parametrize("rows", [1, 2])
def test_a_step_on_a_cache_writes_it_in_place(rows, numerics):
  """A decode step's program on a donated cache copies none of its arrays: at one row XLA:CPU
  would write each layer's invariant cache twice, into copies, unless the attention reads it in
  a branch."""
  model = _model("float32", numerics)
  graphdef, state = nnx.split(model)
  cache = kvc.init_cache(model.cfg, rows, 2 * invariant.KEY_BLOCK).replace(
      lengths_B=jnp.full((rows,), 40, jnp.int32))
  step = jax.jit(lambda s, c, x: nnx.merge(graphdef, s)(x, c).cache, donate_argnums=1)
  program = step.lower(state, cache, jnp.ones((rows, 1), jnp.int32)).compile().as_text()
  shapes = {"f32[" + ",".join(map(str, a.shape)) + "]" for a in cache.k + cache.v}
  copies = [line for line in program.splitlines() if " copy(" in line
            and line.split("= ", 1)[-1].split("{", 1)[0] in shapes]
  assert not copies, copies[:2]


def test_the_log_probs_a_gradient_program_computes_are_the_forward_s():
  """The update recomputes the rollout's log-probs inside its gradient program, where XLA fuses
  the log-softmax otherwise: over 4k-49k vocabularies, under XLA's default flags (the suite's
  cheap ones hide it), "fast" numerics come out ulps apart there; invariant numerics bitwise
  equal."""
  diff = {n: last_json(run_module("tests.models.gradient_logprobs", n, timeout=300,
                                  fast_compile=False))["max_diff"] for n in ("invariant", "fast")}
  assert diff["invariant"] == 0.0 and diff["fast"] > 0.0, diff


def test_the_gradient_of_invariant_numerics_is_the_fast_one_up_to_rounding():
  """A call of several row tiles is differentiated untiled (`invariant._untiled_gradient`): the
  gradient of the tokens' log-probs, every weight's and the embeddings', equals fast numerics'
  to float32 rounding (192 rows: 6 tiles of 32 or more of fewer rows, and attention's query tiles
  in the prefill's loop); a dropped cotangent or a weight's missing gradient would fail it."""
  tokens = jnp.asarray(_tokens(_model("float32", "fast").cfg))

  def grads(numerics):
    def loss(model):
      logp = jax.nn.log_softmax(model(tokens).logits_BxTxV[:, :-1])
      return jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).sum()
    state = nnx.state(nnx.jit(nnx.grad(loss))(_model("float32", numerics)))
    return jax.tree.leaves(state)

  fast, inv = grads("fast"), grads("invariant")
  assert len(fast) == len(inv) and all(np.abs(np.asarray(g)).max() > 0 for g in inv)
  for f, i in zip(fast, inv):
    np.testing.assert_allclose(np.asarray(i), np.asarray(f), rtol=1e-4, atol=1e-5)


# Row-wise products of SmolLM2 and Qwen2.5-1.5B (contraction, output): attention in and out,
# the MLP, SmolLM2's head.
PRODUCTS = [(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152),
            (1536, 1536), (1536, 256), (1536, 8960), (8960, 1536)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_row_tiles_kept_compute_a_row_alike_and_one_row_alone_is_dropped(dtype, monkeypatch):
  """`invariant.row_tiles` on the machine that runs the suite, at real models' shapes: a product
  of each tile it keeps computes a row bitwise as one of `ROW_TILE` rows (checked here on other
  operands); one row alone takes XLA:CPU's matrix-vector kernel and rounds otherwise at most
  shapes, and the probe drops it there (so it can fail)."""
  monkeypatch.setitem(invariant.CANDIDATE_TILES, "cpu", (1, 2, 4, 8, 16, 32))
  rng = np.random.default_rng(1)
  dot = jax.jit(lambda x, w: jnp.dot(x, w), device=jax.devices("cpu")[0])
  dropped_one = 0
  for k, n in PRODUCTS:
    tiles = invariant.row_tiles((("dot", k, n, dtype, 1),))
    assert invariant.ROW_TILE in tiles
    dropped_one += 1 not in tiles
    x = jnp.asarray(rng.standard_normal((max(tiles), k)), dtype)
    w = jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), dtype)
    want = np.asarray(dot(x[:invariant.ROW_TILE], w))
    for tile in tiles:
      np.testing.assert_array_equal(np.asarray(dot(x[:tile], w))[:invariant.ROW_TILE],
                                    want[:tile], err_msg=f"{tile} rows of a {k} x {n} product")
  assert dropped_one >= len(PRODUCTS) // 2


def _smollm2_steps(model, tokens, rows):
  """SmolLM2's logits and hidden states of `tokens[rows]`: a prefill of 8, a decode step, a chain
  verify of 3."""
  call = _CACHED_CALLS.setdefault("smollm2", nnx.jit(lambda m, x, c: m(x, c)))
  cache, outs = kvc.init_cache(model.cfg, len(rows), 64), []
  for a, b in ((0, 8), (8, 9), (9, 12)):
    out = call(model, jnp.asarray(tokens[rows, a:b]), cache)
    cache = kvc.commit(out.cache, jnp.full((len(rows),), b - a))
    outs += [np.asarray(out.logits_BxTxV), np.asarray(out.hidden_BxTxD)]
  return outs


@pytest.mark.slow  # SmolLM2's programs at four row counts, two dtypes
@pytest.mark.xla_default  # the claim under the flags users run
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_smollm2_computes_a_row_alike_in_steps_of_1_8_16_and_32_rows(dtype, monkeypatch):
  """SmolLM2 in invariant numerics: a row's logits and hidden states after a prefill, in a
  decode step and in a verify are bitwise the same whether the call holds it alone or among 7,
  15 or 31 others (the tiles `invariant.row_tiles` keeps: 2 or 4, 8, 16, 32, and loops over the
  largest). With a tile of one row forced, a row alone parts, so the check can fail."""
  from tlt_jax.models.precision import Precision
  from tlt_jax.models.pretrained import load_policy
  model = Precision(param_dtype="float32", compute_dtype=dtype, numerics="invariant").apply(
      load_policy("smollm2"))
  tokens = np.random.default_rng(0).integers(0, model.cfg.vocab_size, (32, 12))
  want = _smollm2_steps(model, tokens, list(range(32)))
  for rows in ([0], list(range(8)), list(range(16))):
    for got, full in zip(_smollm2_steps(model, tokens, rows), want):
      np.testing.assert_array_equal(got, full[:len(rows)], err_msg=f"{len(rows)} rows")
  if dtype == "float32":  # a tile of one row, which `row_tiles` drops, would part
    monkeypatch.setattr(invariant, "model_tiles", lambda cfg: (1, 8, 16, 32))
    _CACHED_CALLS.pop("smollm2")  # a trace reads the tiles
    got = _smollm2_steps(model, tokens, [0])
    assert not all(np.array_equal(g, w[:1]) for g, w in zip(got, want))
