"""The "invariant" numerics mode (`ModelConfig.numerics`): a position's hidden states and logits
are bitwise the same whatever call computes them: a decode step of any number of rows, a chain
verify of T tokens, a prefill, the full forward over whole sequences.

XLA chooses how a reduction runs by the shape of the operation that holds it: on CPU a product of
one row takes another kernel than one of two, one of 64 rows splits its contraction otherwise than
one of 16, a fused reduce vectorises by its output's shape; on a GPU cuBLAS picks algorithms and
split-K by shape. So here no reduction's shape depends on the call:
- every row-wise step (the norms, the projections, RoPE, the MLP, the head) runs over tiles of
  rows of a few fixed sizes in which the machine's products compute a row alike (`row_tiles`
  tries them on the model's products): the smallest that holds the call's rows, between
  optimisation barriers, or a loop (`lax.map`) over tiles of the largest (`row_map`); a norm's
  mean of squares is a product too (`layers.RMSNorm`'s `in_order`), since XLA vectorises a
  reduction by the rows it holds;
- attention reads the keys in blocks of `KEY_BLOCK` slots. A kv head's query rows (its heads
  times the call's tokens, at least two) meet them in products batched over
  (row, kv head[, block]): the scores one product with a row's keys (a score is a sum over the
  head's H alone), the weighted values one product per block, the weights and their sums (a
  tree of elementwise adds over a block) in a branch of their own. Each element of these runs
  alike whatever the number of query rows (from two: one takes a matrix-vector kernel), slots
  or batch elements (tests/models/test_invariant.py holds XLA to it), so a decode step or a
  verify (up to `FEW_ROWS` query rows) runs all its rows in one product, a prefill or a full
  forward `Q_TILE` rows a loop step (with heads of 8, XLA:CPU computes a tile of 8 or more
  otherwise than one of 4). The softmax's maximum is
  exact in any order; the blocks' partial sums are added one after another in slot order, so
  the blocks a query does not see (past its position, or past a shorter call's last slot) add
  exact zeros. A step on a large cache (`LIVE_BYTES`), or of one row, reads only its first
  blocks, as many as the smallest power of two that holds its longest row's end (a
  `lax.switch`): the same sums, less the zeros, at most twice the prefix's cost rather than the
  cache's.
The cache of a model in this mode is laid out for it (`kv_cache.init_cache`: keys `[B, K, H, S]`
and values `[B, K, S, H]`, slots in whole key blocks), so a step reads its blocks where they lie,
with no copy of the cache (keys `[B, K, S, H]` cost a transpose a product: 5x the scores').
A key's slot is its position in a chain (decode, chain verify, prefill, the trainer's full
forward over left-aligned sequences), so a query meets the same keys in the same blocks in every
call. A tree verify writes a node at its index among the tree's nodes, so each of its nodes
attends over a copy of the keys laid out as the chain it ends (`_as_chains`). Tensor parallelism
across layouts is not invariant (a split contraction's partial sums add in another order).
A gradient needs no fixed order: a row-wise step of several tiles is differentiated as one call
over all its rows (`row_map`'s `rowwise`), attention as XLA's own over the same inputs
(`plain_attention`), which costs what fast numerics' backward does.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tlt_jax.kernels import invariant_pallas
from tlt_jax.kernels.attention import INVARIANT_BLOCK
from tlt_jax.models import kv_cache as kvc

ROW_TILE = 16   # rows of a row-wise step's tile on every backend; its loop's tile on most
# Smaller and larger tiles a backend may run instead, where its products compute a row alike in
# them and in ROW_TILE: XLA:CPU mostly does from 2 rows to 32 (f32; bf16 from 3), by a
# contraction split chosen from all three dimensions (on an Intel Xeon in f32 a width of 896
# parts at 2-8 rows, 768 at 32), so `row_tiles` tries each on the model's own products; cuBLAS
# picks its algorithm by shape, so elsewhere every step runs ROW_TILE.
CANDIDATE_TILES = {"cpu": (2, 4, 8, 16, 32)}
KEY_BLOCK = INVARIANT_BLOCK  # key slots of each attention block (a cache's slots: whole blocks)
assert KEY_BLOCK & (KEY_BLOCK - 1) == 0, "a block's weights add in halves: a power of two"
Q_TILE = 4      # query rows (of one kv head) of each attention product in a prefill: its granule
FEW_ROWS = 64   # query rows of a kv head up to which a call runs them in one product
# The attention's implementation: None picks by backend ("pallas" on a GPU, else "jnp");
# "interpret" runs the Pallas kernel interpreted (tests on CPU).
KERNEL: str | None = None
LIVE_BYTES = 8 << 20  # a layer's keys and values past which a call on a cache reads live blocks
_NEG = -1e30    # a score no query sees (finite: the masked terms' gradients stay finite)


def row_tiles(products: tuple[tuple, ...]) -> tuple[int, ...]:
  """The row tiles a row-wise step may run on this machine: of the backend's `CANDIDATE_TILES`,
  those in which each of `products` computes a row bitwise as in a product of `ROW_TILE` rows
  (random operands: products of each tile over ROW_TILE rows or more, against products of
  ROW_TILE rows over the same rows; cached per process), ROW_TILE alone
  elsewhere and in a run of several processes (hosts may split a product differently, and
  every process must trace the same programs). A product is `(form, k, n, dtype, per_row)`:
  "dot" `[R * per_row, k] @ [k, n]` in the dtype, "acc" the same with float32 sums, "table" a
  tied head's `[n, k]` table against the rows."""
  candidates = CANDIDATE_TILES.get(jax.default_backend())
  if candidates is None or jax.process_count() > 1:
    return (ROW_TILE,)
  return _agreeing(candidates, tuple(products))


@functools.cache
def _agreeing(candidates: tuple[int, ...], products: tuple[tuple, ...]) -> tuple[int, ...]:
  keep = set(candidates) | {ROW_TILE}
  with jax.ensure_compile_time_eval():
    for i, (form, k, n, dtype, per_row) in enumerate(products):
      # Operands drawn on the host: a JAX draw of a head's table builds a program of seconds.
      rng = np.random.default_rng(i)
      x = jnp.asarray(rng.standard_normal((max(keep) * per_row, k), np.float32), dtype)
      w = jnp.asarray(rng.standard_normal((n, k) if form == "table" else (k, n), np.float32)
                      / np.float32(k ** 0.5), dtype)
      product = _PRODUCT_FORMS[form]
      run = lambda tile, rows: np.concatenate([np.asarray(product(x[j:j + tile * per_row], w))
                                               for j in range(0, rows * per_row, tile * per_row)])
      # A tile is checked on ROW_TILE rows or more, not on its own few: a product may round
      # otherwise at a few outputs in 10^4 only (bf16 sums whose last bits differ where a
      # rounding boundary lies between them), which one row's outputs can miss.
      want = {rows: run(ROW_TILE, rows) for rows in {max(t, ROW_TILE) for t in keep}}
      for tile in sorted(keep - {ROW_TILE}):
        if not np.array_equal(run(tile, max(tile, ROW_TILE)), want[max(tile, ROW_TILE)]):
          keep.discard(tile)
  return tuple(sorted(keep))


_PRODUCT_FORMS = {
    "dot": jax.jit(lambda x, w: jnp.dot(x, w)),
    "acc": jax.jit(lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32)),
    "table": jax.jit(lambda x, w: jnp.einsum("vd,td->tv", w, x,
                                             preferred_element_type=jnp.float32)),
}


def model_tiles(cfg) -> tuple[int, ...]:
  """`row_tiles` of a model config's row-wise products (the projections in its compute dtype,
  the head, the norms' sums with two columns of ones)."""
  d, h, dt = cfg.d_model, cfg.hd, jnp.dtype(cfg.dtype).name
  products = [("dot", d, (cfg.n_heads + 2 * cfg.n_kv_heads) * h, dt, 1),
              ("dot", cfg.n_heads * h, d, dt, 1), ("dot", d, 2 * cfg.d_ff, dt, 1),
              ("dot", cfg.d_ff, d, dt, 1), ("acc", d, 2, "float32", 1),
              ("table" if cfg.tie_embeddings else "acc", d, cfg.vocab_size, dt, 1)]
  if cfg.qk_norm:  # per head, of the queries and of the keys
    products += [("acc", h, 2, "float32", cfg.n_heads), ("acc", h, 2, "float32", cfg.n_kv_heads)]
  return row_tiles(tuple(products))


def row_tile(rows: int, tiles: tuple[int, ...]) -> int:
  """The tile of a row-wise step over `rows` rows: the smallest of `tiles` that holds them (a
  decode step of one row costs a product of a few rows, one of 32 rows one of 32, not two of
  16), else the largest."""
  return next((t for t in tiles if rows <= t), tiles[-1])


def row_map(fn, *arrays_R, tiles: tuple[int, ...] = (ROW_TILE,), tile: int | None = None,
            rowwise: bool = True):
  """`fn` over tiles of `tile` rows (default `row_tile(R, tiles)`) of arrays with R leading rows
  (zero rows pad the last tile; they are cut off again); `fn` maps tiles `[tile, ...]` to a pytree
  of them. Several tiles run in a loop (`lax.map`), one loop body of one shape; a single tile runs
  as that body between optimisation barriers (XLA:CPU fuses elementwise operations across them
  all the same: a tile's products are what keep their shape), so a call of up to `tile` rows
  costs one tile and no loop.
  A `rowwise` `fn` (one that maps any number of rows, row by row) differentiates a call of
  several tiles as `fn` over all its rows at once (`_untiled_gradient`)."""
  r = arrays_R[0].shape[0]
  tile = row_tile(r, tiles) if tile is None else tile
  real = -(-r // tile)

  def tiled(fn, *arrays_R):
    pad = real * tile - r
    tiles = tuple(jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1)).reshape(
        -1, tile, *a.shape[1:]) for a in arrays_R)
    if real >= 2:
      out = jax.lax.map(lambda xs: fn(*xs), tiles)
    else:
      barrier = jax.lax.optimization_barrier
      out = jax.tree.map(lambda y: y[None], barrier(fn(*barrier(tuple(t[0] for t in tiles)))))
    return jax.tree.map(lambda y: y.reshape(-1, *y.shape[2:])[:r], out)

  if rowwise and real >= 2:
    return _untiled_gradient(fn, tiled, tile, arrays_R)
  return tiled(fn, *arrays_R)


def _untiled_gradient(fn, tiled, tile: int, arrays_R):
  """`tiled(fn, *arrays_R)`, differentiated as `fn` over all the rows at once: a gradient needs
  no fixed order, and a loop's backward of small products, each adding into every weight's
  gradient, cost the update 1.7-2.3x fast numerics'. The weights `fn` closes over become
  arguments (`jax.closure_convert`) twice: at a tile's shapes for the value, at the whole
  arrays' for the gradient (their cotangents add up where they are the same weights)."""
  tile_args = [jnp.zeros((tile, *a.shape[1:]), a.dtype) for a in arrays_R]
  tile_fn, tile_consts = jax.closure_convert(fn, *tile_args)
  whole_fn, whole_consts = jax.closure_convert(fn, *arrays_R)

  @jax.custom_vjp
  def value(tile_consts, whole_consts, arrays):
    return tiled(lambda *xs: tile_fn(*xs, *tile_consts), *arrays)

  def forward(tile_consts, whole_consts, arrays):
    return value(tile_consts, whole_consts, arrays), (tile_consts, whole_consts, arrays)

  def backward(residuals, cotangent):
    tile_consts, whole_consts, arrays = residuals
    _, vjp = jax.vjp(lambda c, a: whole_fn(*a, *c), whole_consts, arrays)
    return (jax.tree.map(jnp.zeros_like, tile_consts), *vjp(cotangent))

  value.defvjp(forward, backward)
  return value(tile_consts, whole_consts, tuple(arrays_R))


def attention(q_BxTxNxH, k_BxKxHxS, v_BxKxSxH, visible_BxTxS, live_slots=None) -> jax.Array:
  """Grouped-query softmax attention of T queries over S key slots as `visible_BxTxS` allows,
  in an order fixed per output element (the module docstring; on a GPU the Pallas kernel's,
  `kernels/invariant_pallas.py`, as `KERNEL` says); the result `[B, T, N, H]` in the values'
  dtype. `live_slots`: `jnp_attention`'s."""
  b, t, n, h = q_BxTxNxH.shape
  kh, s = k_BxKxHxS.shape[1], k_BxKxHxS.shape[3]
  g = n // kh
  # Query rows of kv head k: its G heads, each over the T tokens.
  q_BxKxMxH = q_BxTxNxH.reshape(b, t, kh, g, h).transpose(0, 2, 3, 1, 4).reshape(b, kh, g * t, h)
  vis_BxMxS = jnp.broadcast_to(visible_BxTxS[:, None], (b, g, t, s)).reshape(b, g * t, s)
  kernel = KERNEL or ("pallas" if jax.default_backend() == "gpu" else "jnp")
  if kernel == "jnp":
    ordered = lambda q, k, v: jnp_attention(q, k, v, vis_BxMxS, live_slots)
  else:
    ordered = lambda q, k, v: invariant_pallas.call_kernel(q, k, v, vis_BxMxS,
                                                           interpret=kernel == "interpret")
  out_BxKxMxH = _differentiated_plainly(ordered, vis_BxMxS)(q_BxKxMxH, k_BxKxHxS, v_BxKxSxH)
  out = out_BxKxMxH.reshape(b, kh, g, t, h).transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)
  return out.astype(v_BxKxSxH.dtype)


def _differentiated_plainly(ordered, visible_BxMxS):
  """`ordered` (queries, keys, values -> `[B, K, M, H]` float32, in a fixed order),
  differentiated as `plain_attention`, the same function in XLA's own order: a gradient needs
  no fixed order, and the loop over query tiles and the exponentials' branch, differentiated
  step by step, would cost the update a backward of small steps where XLA's is one of each."""

  @jax.custom_vjp
  def fn(q, k, v):
    return ordered(q, k, v)

  def forward(q, k, v):
    return fn(q, k, v), (q, k, v)

  def backward(residuals, cotangent):
    return jax.vjp(lambda *x: plain_attention(*x, visible_BxMxS), *residuals)[1](cotangent)

  fn.defvjp(forward, backward)
  return fn


def plain_attention(q_BxKxMxH, k_BxKxHxS, v_BxKxSxH, visible_BxMxS) -> jax.Array:
  """`jnp_attention`'s function (less `live_slots`) in XLA's own order, float32 `[B, K, M, H]`:
  one softmax over every slot (a query that sees none averages every value, as there)."""
  scale = jnp.sqrt(jnp.float32(q_BxKxMxH.shape[-1]))
  scores = jnp.einsum("bkmh,bkhs->bkms", q_BxKxMxH, k_BxKxHxS,
                      preferred_element_type=jnp.float32) / scale
  weights = jax.nn.softmax(jnp.where(visible_BxMxS[:, None], scores, _NEG), axis=-1)
  return jnp.einsum("bkms,bksh->bkmh", weights, v_BxKxSxH.astype(jnp.float32))


def jnp_attention(q_BxKxMxH, k_BxKxHxS, v_BxKxSxH, visible_BxMxS, live_slots=None) -> jax.Array:
  """Each kv head's M query rows over S key slots as `visible_BxMxS` allows, float32 `[B, K, M,
  H]`, in `jnp` in the order the module docstring fixes. With `live_slots` (a traced count: no
  query sees a slot at or past it; a call on a cache, never differentiated), a call of few query
  tiles whose keys and values exceed `LIVE_BYTES`, or of one row, reads only the first blocks
  that hold those slots, as many as the smallest power of two (or all) that covers them, one
  branch of a `lax.switch` each: a block past them would add exact zeros, so the result is the
  same, and the step costs at most twice the prefix it attends to, not the cache's length
  (below `LIVE_BYTES` the branches cost compiles and little time, except at one row)."""
  b, kh, m, h = q_BxKxMxH.shape
  s = k_BxKxHxS.shape[3]
  nb = -(-s // KEY_BLOCK)
  pad = nb * KEY_BLOCK - s
  # The query rows in I tiles of Q rows: one tile of them all in a decode step or a verify (at
  # least two: one row takes a matrix-vector kernel), else tiles of Q_TILE (zero rows pad both).
  few = m <= FEW_ROWS
  rows = max(m, 2) if few else Q_TILE
  padded = -(-m // rows) * rows
  q_IxBxKxQxH = jnp.pad(q_BxKxMxH, [(0, 0), (0, 0), (0, padded - m), (0, 0)]).reshape(
      b, kh, -1, rows, h).transpose(2, 0, 1, 3, 4)
  vis_IxBxJxQxC = jnp.pad(visible_BxMxS, [(0, 0), (0, padded - m), (0, pad)]).reshape(
      b, -1, rows, nb, KEY_BLOCK).transpose(1, 0, 3, 2, 4)

  def exps(x_xQxC, top_xQx1):
    """The weights and, per row of a block, their sum (a slot no query sees has a score of
    `_NEG`: its weight is an exact zero, except in a padding row, which sees none), in a branch
    of a conditional XLA cannot resolve (its predicate comes through an optimisation barrier):
    XLA:CPU computes a fused exponential in a vectorised loop and its scalar remainder, an
    element falling in either by the fusion's shape, unless the branch's parameters hold it.
    A sum adds the block's halves elementwise down to one slot: one order in any shape."""
    def fn(x_xQxC, top_xQx1):
      p_xQxC = jnp.exp(x_xQxC - top_xQx1)
      sums = p_xQxC
      while sums.shape[-1] > 1:
        half = sums.shape[-1] // 2
        sums = sums[..., :half] + sums[..., half:]
      return p_xQxC, sums
    taken = jax.lax.optimization_barrier(jnp.bool_(True))
    return jax.lax.cond(taken, fn, fn, x_xQxC, top_xQx1)

  def blocks(k_BxKxHxS, v_BxKxSxH):
    """The keys `[B, K, H, J * C]` and the float32 values `[B, K, J, C, H]` in whole blocks."""
    return (jnp.pad(k_BxKxHxS, [(0, 0), (0, 0), (0, 0), (0, pad)]),
            jnp.pad(v_BxKxSxH.astype(jnp.float32), [(0, 0), (0, 0), (0, pad), (0, 0)]
                    ).reshape(b, kh, nb, KEY_BLOCK, h))

  # Each step on tiles `[I, ...]` (I query tiles) over the first `j` blocks, its products in
  # loops of one shape, one tile a step, each batched over all leading axes (every element runs
  # alike whatever the batch).
  def scores_of(j, keys_BxKxHxS, q_1xBxKxQxH):
    s_BxKxQxS = jax.lax.dot_general(q_1xBxKxQxH[0], keys_BxKxHxS[..., :j * KEY_BLOCK],
                                    (((3,), (2,)), ((0, 1), (0, 1))),
                                    preferred_element_type=jnp.float32)
    return s_BxKxQxS.reshape(b, kh, rows, j, KEY_BLOCK).transpose(0, 1, 3, 2, 4)[None]

  def weights_of(scores_IxBxKxJxQxC, vis_IxBxJxQxC):
    seen = jnp.broadcast_to(vis_IxBxJxQxC[:, :, None], scores_IxBxKxJxQxC.shape)
    x = jnp.where(seen, scores_IxBxKxJxQxC / jnp.sqrt(jnp.float32(h)), _NEG)
    return exps(x, jnp.max(x, axis=(3, 5), keepdims=True))  # the maximum: exact

  def values_of(values_BxKxJxCxH, p_1xBxKxJxQxC, sums_1xBxKxJxQx1):
    """The weighted values of each block and, beside them, its weights' sum."""
    p = p_1xBxKxJxQxC[0]
    values = values_BxKxJxCxH[:, :, :p.shape[2]]
    weighted = jax.lax.dot_general(p, values, (((4,), (3,)), ((0, 1, 2), (0, 1, 2))),
                                   preferred_element_type=jnp.float32)
    return jnp.concatenate([weighted[None], sums_1xBxKxJxQx1], axis=-1)

  def normalised(part_IxBxKxJxQxH1):
    total = part_IxBxKxJxQxH1[:, :, :, 0]
    for j in range(1, part_IxBxKxJxQxH1.shape[3]):  # in slot order
      total = total + part_IxBxKxJxQxH1[:, :, :, j]
    return total[..., :h] / total[..., h:]  # at least 1: a row's largest weight is exp(0)

  def tile(j, q, vis, k, v):  # a query tile all the way over the first j blocks
    keys, values = blocks(k, v)
    return normalised(values_of(values, *weights_of(scores_of(j, keys, q), vis[:, :, :j])))

  if few:  # a decode step or a verify: its one tile all the way
    read = b * kh * s * h * (k_BxKxHxS.dtype.itemsize + v_BxKxSxH.dtype.itemsize)
    every = functools.partial(tile, nb)
    # One row reads its blocks in the switch whatever their bytes: XLA:CPU drops a batch axis of
    # one from the read, then fuses the cache's write into the read a second time (three copies
    # of each layer's cache a step) unless the read lies in a branch (and its blocks with it).
    if live_slots is not None and (read > LIVE_BYTES or b == 1):  # the same sums either way
      counts = [1 << i for i in range((nb - 1).bit_length())] + [nb]
      live = -(-live_slots // KEY_BLOCK)
      branch = sum((live > c).astype(jnp.int32) for c in counts[:-1])
      every = lambda *args: jax.lax.switch(branch, [functools.partial(tile, c) for c in counts],
                                           *args)
    out_IxBxKxQxH = every(q_IxBxKxQxH, vis_IxBxJxQxC, k_BxKxHxS, v_BxKxSxH)
  else:  # the same steps, each over every tile
    keys, values = blocks(k_BxKxHxS, v_BxKxSxH)
    scores = row_map(functools.partial(scores_of, nb, keys), q_IxBxKxQxH, tile=1, rowwise=False)
    p, sums = weights_of(scores, vis_IxBxJxQxC)
    out_IxBxKxQxH = normalised(row_map(functools.partial(values_of, values), p, sums, tile=1,
                                       rowwise=False))
  return out_IxBxKxQxH.transpose(1, 2, 0, 3, 4).reshape(b, kh, padded, h)[:, :, :m]


def _as_chains(keys_BxKxHxS, values_BxKxSxH, lengths_B, depth_BxT, mask_BxTxT):
  """A tree's T new tokens (written at slots `lengths + index`) seen as the chains they end: for
  each token its own keys `[B * T, K, H, S]` and values `[B * T, K, S, H]` where the slot
  `lengths + e` holds its ancestor at depth e, as a chain verify or decode steps would have
  written it, and what it sees `[B * T, 1, S]` (the prefix and that chain)."""
  b, t = depth_BxT.shape
  s = values_BxKxSxH.shape[2]
  at_depth = depth_BxT[:, None, :, None] == jnp.arange(t)  # [B, T, T(node), T(depth)]
  anc_BxTxT = jnp.argmax(mask_BxTxT[..., None] & at_depth, axis=2)  # query, depth -> node
  e_BxS = jnp.arange(s)[None, :] - lengths_B[:, None]
  new_BxS = (e_BxS >= 0) & (e_BxS < t)
  node_BxTxS = jnp.take_along_axis(anc_BxTxT, jnp.broadcast_to(
      jnp.clip(e_BxS, 0, t - 1)[:, None, :], (b, t, s)), axis=2)
  src_BxTxS = jnp.where(new_BxS[:, None], lengths_B[:, None, None] + node_BxTxS, jnp.arange(s))
  gather = lambda x, axis: jnp.take_along_axis(x[:, None], jnp.expand_dims(  # slots on `axis`
      src_BxTxS, tuple(d for d in (2, 3, 4) if d != axis + 1)), axis=axis + 1).reshape(
          b * t, *x.shape[1:])
  seen_BxTxS = (e_BxS[:, None, :] < 0) | (new_BxS[:, None] & (e_BxS[:, None, :] <= depth_BxT[
      ..., None]))
  return gather(keys_BxKxHxS, 3), gather(values_BxKxSxH, 2), seen_BxTxS.reshape(b * t, 1, s)


def block(block, x_BxTxD, positions_BxT, mask_BxTxT, cache: kvc.KVCache | None, layer: int,
          tree: bool = False):
  """A decoder layer (`transformer.Block`) in invariant numerics. Without a cache the T tokens
  attend to each other as `mask_BxTxT` allows; with one, to the committed prefix and to each other
  (the new keys written first, at each row's next slots). With `tree` (a tree verify: tokens at
  their index, positions by depth), each token attends over the chain it ends, laid out as a chain
  would be (`_as_chains`), so it is computed as a decode step at its position is. Returns the
  output and, with a cache, the layer's cache arrays holding the new entries
  (`kv_cache.write_kv`'s), else the new keys and values `[B, T, K, H]`."""
  b, t, d = x_BxTxD.shape

  def qkv(x_RxD, pos_R):
    normed = x_RxD if block.input_norm is None else block.input_norm(x_RxD, in_order=True)
    q, k, v = block.attn.qkv(normed[None], pos_R[None])
    return q[0], k[0], v[0]

  q, k, v = (a.reshape(b, t, *a.shape[1:])
             for a in row_map(qkv, x_BxTxD.reshape(b * t, d), positions_BxT.reshape(b * t),
                             tiles=model_tiles(block.attn.cfg)))
  if cache is None:
    written = (k, v)
    keys, values, visible = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3), mask_BxTxT
  else:
    if cache.impl != "invariant":
      raise ValueError(f"A model in invariant numerics reads a cache in the 'invariant' layout "
                       f"(`kv_cache.init_cache` of its config), not {cache.impl!r}.")
    written = kvc.write_kv(cache, layer, k, v)
    keys, values = written  # [B, K, H, S], [B, K, S, H]
    s = values.shape[2]
    slot_S = jnp.arange(s)
    committed_BxS = slot_S[None, :] < cache.lengths_B[:, None]
    new_at_BxTxS = slot_S[None, None, :] == (cache.lengths_B[:, None] + jnp.arange(t))[..., None]
    sees_new = jnp.einsum("bij,bjs->bis", mask_BxTxT.astype(jnp.int32),
                          new_at_BxTxS.astype(jnp.int32)) > 0
    visible = committed_BxS[:, None, :] | sees_new
    if tree:
      keys, values, visible = _as_chains(keys, values, cache.lengths_B,
                                         positions_BxT - cache.lengths_B[:, None], mask_BxTxT)
      q = q.reshape(b * t, 1, *q.shape[2:])
  live = None if cache is None else jnp.max(cache.lengths_B) + t
  attended = attention(q, keys, values, visible, live).reshape(b, t, *q.shape[2:])

  def rest(x_RxD, a_RxNxH):
    x_RxD = x_RxD + block.attn.out(a_RxNxH[None])[0]
    return x_RxD + block.mlp(block.post_attn_norm(x_RxD, in_order=True))

  out = row_map(rest, x_BxTxD.reshape(b * t, d), attended.reshape(b * t, *attended.shape[2:]),
                tiles=model_tiles(block.attn.cfg))
  return out.reshape(b, t, d), written


def head(model, x_BxTxD):
  """The final norm and the head, row tile by row tile: hidden states `[B, T, D]` and float32
  logits `[B, T, V]`."""
  b, t, d = x_BxTxD.shape

  def fn(x_RxD):
    hidden = model.final_norm(x_RxD, in_order=True)
    return hidden, model.head(hidden[None])[0]

  hidden, logits = row_map(fn, x_BxTxD.reshape(b * t, d), tiles=model_tiles(model.cfg))
  return hidden.reshape(b, t, d), logits.reshape(b, t, -1)
