"""Attention of a call's new tokens over each row's cached prefix: one Pallas kernel (split-K
flash decoding) written for the GPU's Triton backend, run on CPU with `interpret=True`.

Every one of a call's T new tokens sees the same cached prefix, the first `lengths_B[b]` slots
of row b, whether the tokens form a chain or a tree. So the T tokens fold into the query rows:
each kv head serves R = G * T rows, and the prefix becomes one decode-attention problem per
(row, kv head), whatever T is. Programs take the slots in `splits` ranges in parallel (the
batch and kv heads alone fill few of a GPU's cores at small batch); each walks its range in
tiles of `block_k` slots, only up to the row's length, keeping an online softmax. The output is
unnormalised, with its softmax statistics per range: `attention.py` merges the ranges and the
new tokens' own segment (causal or a tree, small) by log-sum-exp.

Keys and values are both `[B, K, S, H]`, this path's cache layout: a program reads contiguous
`[block_k, H]` tiles of one head. JAX's `pallas/ops/gpu/decode_attention.gqa` solves the
one-token case with keys `[B, S, K, H]` that it transposes per call, a copy of each layer's cache
per step; it has no multi-token form.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# A masked score: finite, so that no `inf - inf` arises when a range holds no slot of its row.
NEG = -0.7 * float(jnp.finfo(jnp.float32).max)
MIN_TILE = 16  # Triton's smallest matrix-product tile


def _pow2_at_least(n: int, floor: int = MIN_TILE) -> int:
  return max(floor, 1 << max(n - 1, 0).bit_length())


def tiling(slots: int, block_k: int = 64, max_splits: int = 8) -> tuple[int, int]:
  """(block_k, splits) for a cache of `slots` slots (a multiple of `MIN_TILE`): the largest
  power-of-two tile up to `block_k` that divides it, and the most ranges up to `max_splits` that
  cut it into whole tiles."""
  if slots % MIN_TILE:
    raise ValueError(f"The pallas cache layout needs a multiple of {MIN_TILE} slots, got {slots}.")
  while slots % block_k:
    block_k //= 2
  tiles = slots // block_k
  splits = max(d for d in range(1, max_splits + 1) if tiles % d == 0)
  return block_k, splits


def _kernel(q_ref, k_ref, v_ref, len_ref, o_ref, l_ref, m_ref, *, block_k: int, scale: float):
  span = k_ref.shape[0]
  n = jnp.clip(len_ref[...] - pl.program_id(2) * span, 0, span)  # this range's slots in use
  q_RxH = q_ref[...]
  rows = q_RxH.shape[0]

  def tile(i, carry):
    o_RxH, m_R, l_R = carry
    k_CxH = k_ref[pl.ds(i * block_k, block_k), :]
    v_CxH = v_ref[pl.ds(i * block_k, block_k), :]
    s_RxC = jax.lax.dot_general(q_RxH, k_CxH, (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32) * scale
    valid_C = i * block_k + jnp.arange(block_k) < n
    s_RxC = jnp.where(valid_C[None, :], s_RxC, NEG)
    m_new_R = jnp.maximum(m_R, s_RxC.max(axis=-1))
    keep_R = jnp.exp(m_R - m_new_R)
    p_RxC = jnp.exp(s_RxC - m_new_R[:, None])
    o_RxH = keep_R[:, None] * o_RxH + jnp.dot(p_RxC.astype(v_CxH.dtype), v_CxH,
                                              preferred_element_type=jnp.float32)
    return o_RxH, m_new_R, keep_R * l_R + p_RxC.sum(axis=-1)

  init = (jnp.zeros((rows, q_RxH.shape[1]), jnp.float32), jnp.full((rows,), NEG, jnp.float32),
          jnp.zeros((rows,), jnp.float32))
  o_RxH, m_R, l_R = jax.lax.fori_loop(0, pl.cdiv(n, block_k), tile, init)
  o_ref[...] = o_RxH
  l_ref[...] = l_R
  m_ref[...] = m_R


@functools.partial(jax.jit, static_argnames=("interpret", "block_k", "max_splits"))
def prefix_attention(q_BxKxRxH, k_BxKxSxH, v_BxKxSxH, lengths_B, *, interpret: bool,
                     block_k: int = 64, max_splits: int = 8):
  """Unnormalised attention of R query rows per kv head over each row's first `lengths_B` cache
  slots: `(o [B, K, splits, R, H], l [B, K, splits, R], m [B, K, splits, R])`, float32, where
  range j's softmax is `exp(s - m[..., j, :]) / l[..., j, :]` and `o` its unnormalised sum."""
  b, kh, r, h = q_BxKxRxH.shape
  slots = k_BxKxSxH.shape[2]
  block_k, splits = tiling(slots, block_k, max_splits)
  span = slots // splits
  block_r = min(_pow2_at_least(r), 64)
  r_blocks = pl.cdiv(r, block_r)
  q = jnp.pad(q_BxKxRxH, ((0, 0), (0, 0), (0, r_blocks * block_r - r), (0, 0)))
  head = lambda i, j, s: (i, j // r_blocks)
  params = None if interpret else plgpu.CompilerParams(num_warps=4, num_stages=2)
  o, l, m = pl.pallas_call(
      functools.partial(_kernel, block_k=block_k, scale=1.0 / float(h) ** 0.5),
      grid=(b, kh * r_blocks, splits),
      in_specs=[
          pl.BlockSpec((None, None, block_r, h), lambda i, j, s: (*head(i, j, s), j % r_blocks, 0)),
          pl.BlockSpec((None, None, span, h), lambda i, j, s: (*head(i, j, s), s, 0)),
          pl.BlockSpec((None, None, span, h), lambda i, j, s: (*head(i, j, s), s, 0)),
          pl.BlockSpec((None,), lambda i, j, s: (i,)),
      ],
      out_specs=[
          pl.BlockSpec((None, None, None, block_r, h),
                       lambda i, j, s: (*head(i, j, s), s, j % r_blocks, 0)),
          pl.BlockSpec((None, None, None, block_r),
                       lambda i, j, s: (*head(i, j, s), s, j % r_blocks)),
          pl.BlockSpec((None, None, None, block_r),
                       lambda i, j, s: (*head(i, j, s), s, j % r_blocks)),
      ],
      out_shape=[jax.ShapeDtypeStruct((b, kh, splits, q.shape[2], h), jnp.float32),
                 jax.ShapeDtypeStruct((b, kh, splits, q.shape[2]), jnp.float32),
                 jax.ShapeDtypeStruct((b, kh, splits, q.shape[2]), jnp.float32)],
      compiler_params=params, interpret=interpret, name="prefix_attention",
  )(q, k_BxKxSxH, v_BxKxSxH, lengths_B.astype(jnp.int32))
  return o[..., :r, :], l[..., :r], m[..., :r]
