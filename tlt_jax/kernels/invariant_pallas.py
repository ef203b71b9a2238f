"""Attention in invariant numerics on a GPU: one Pallas kernel for the Triton backend (run on CPU
with `interpret=True`), in an order fixed per output element whatever the call.

`models.invariant.attention` fixes its order in `jnp`, with batched products whose every element
has one shape; that holds XLA:CPU to one kernel per element, but on a GPU cuBLAS and Triton
choose an algorithm (and a split-K) by the whole batch's shape. Here each program computes one
tile of `BLOCK_R` query rows of one kv head of one row: it walks the key blocks of `BLOCK`
slots from the first, in slot order, with an online softmax, up to the last block the row
sees (a block past it would leave the sums as they are: its weights are exact zeros and its
scores cannot raise the maximum). Its products are `[BLOCK_R, H] x [H, BLOCK]` and
`[BLOCK_R, BLOCK] x [BLOCK, H]` in every call, with no split over the keys: a query row's output
depends on its own row, the keys and values it sees and their slots, never on the rows beside
it, the number of rows, tokens or programs, or the cache's length. It is not bitwise the `jnp`
path (the two sum in other orders); each is invariant on its own backend.

Keys and values are the invariant layout's, `[B, K, H, S]` and `[B, K, S, H]`
(`kv_cache.init_cache`), slots in whole blocks. A pallas call has no derivative:
`models.invariant.attention` differentiates this kernel, as its `jnp` path, as XLA's own
attention over the same inputs (the update's gradient needs no fixed order, only its forward
does, which is this kernel's).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from tlt_jax.kernels.attention import INVARIANT_BLOCK
from tlt_jax.kernels.prefix_pallas import MIN_TILE

BLOCK = INVARIANT_BLOCK  # key slots a loop step reads
BLOCK_R = MIN_TILE       # query rows of a program (Triton's smallest product tile)
_NEG = -1e30             # a score no query sees


def _kernel(q_ref, k_ref, v_ref, vis_ref, ext_ref, o_ref, *, scale: float):
  q_RxH = q_ref[...]

  def block(j, carry):
    o_RxH, m_R, l_R = carry
    k_HxC = k_ref[:, pl.ds(j * BLOCK, BLOCK)]
    v_CxH = v_ref[pl.ds(j * BLOCK, BLOCK), :]
    seen_RxC = vis_ref[:, pl.ds(j * BLOCK, BLOCK)] != 0
    s_RxC = jnp.dot(q_RxH, k_HxC, preferred_element_type=jnp.float32) * scale
    s_RxC = jnp.where(seen_RxC, s_RxC, _NEG)
    m_new_R = jnp.maximum(m_R, s_RxC.max(axis=-1))
    keep_R = jnp.exp(m_R - m_new_R)
    p_RxC = jnp.where(seen_RxC, jnp.exp(s_RxC - m_new_R[:, None]), 0.0)
    o_RxH = keep_R[:, None] * o_RxH + jnp.dot(p_RxC, v_CxH.astype(jnp.float32),
                                              preferred_element_type=jnp.float32)
    return o_RxH, m_new_R, keep_R * l_R + p_RxC.sum(axis=-1)

  rows, h = q_RxH.shape
  init = (jnp.zeros((rows, h), jnp.float32), jnp.full((rows,), _NEG, jnp.float32),
          jnp.zeros((rows,), jnp.float32))
  o_RxH, _, l_R = jax.lax.fori_loop(0, pl.cdiv(ext_ref[...], BLOCK), block, init)
  # A row that sees a key has a sum of at least 1 (its largest weight is exp(0)); one that sees
  # none (padding) is 0 and divides by 1.
  o_ref[...] = o_RxH / jnp.maximum(l_R, 1.0)[:, None]


@functools.partial(jax.jit, static_argnames=("interpret",))
def call_kernel(q_BxKxMxH, k_BxKxHxS, v_BxKxSxH, visible_BxMxS, *, interpret: bool):
  """The kernel alone (no gradient): float32 `[B, K, M, H]`, as `attention`."""
  b, kh, m, h = q_BxKxMxH.shape
  tiles, slots = pl.cdiv(m, BLOCK_R), k_BxKxHxS.shape[3]
  s = pl.cdiv(slots, BLOCK) * BLOCK  # a cache holds whole blocks; a full forward's keys may not
  q = jnp.pad(q_BxKxMxH, ((0, 0), (0, 0), (0, tiles * BLOCK_R - m), (0, 0)))
  k = jnp.pad(k_BxKxHxS, ((0, 0), (0, 0), (0, 0), (0, s - slots)))
  v = jnp.pad(v_BxKxSxH, ((0, 0), (0, 0), (0, s - slots), (0, 0)))
  vis = jnp.pad(visible_BxMxS, ((0, 0), (0, tiles * BLOCK_R - m), (0, s - slots)))
  # Each row's extent: one past the last slot any of its queries sees.
  extent_B = jnp.max(jnp.where(vis, jnp.arange(1, s + 1, dtype=jnp.int32), 0), axis=(1, 2))
  params = None if interpret else plgpu.CompilerParams(num_warps=4, num_stages=2)
  out = pl.pallas_call(
      functools.partial(_kernel, scale=1.0 / float(h) ** 0.5),
      grid=(b, kh, tiles),
      in_specs=[
          pl.BlockSpec((None, None, BLOCK_R, h), lambda i, j, r: (i, j, r, 0)),
          pl.BlockSpec((None, None, h, s), lambda i, j, r: (i, j, 0, 0)),
          pl.BlockSpec((None, None, s, h), lambda i, j, r: (i, j, 0, 0)),
          pl.BlockSpec((None, BLOCK_R, s), lambda i, j, r: (i, r, 0)),
          pl.BlockSpec((None,), lambda i, j, r: (i,)),
      ],
      out_specs=pl.BlockSpec((None, None, BLOCK_R, h), lambda i, j, r: (i, j, r, 0)),
      out_shape=jax.ShapeDtypeStruct((b, kh, tiles * BLOCK_R, h), jnp.float32),
      compiler_params=params, interpret=interpret, name="invariant_attention",
  )(q, k, v, vis.astype(jnp.int8), extent_B)
  return out[:, :, :m]
