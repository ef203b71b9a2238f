"""The attention seam: a call's T new tokens attend to each row's cached prefix and to each
other, by one of two implementations that give the same result.

- `xla`: one softmax over both segments from two batched products (the cached prefix read
  whole, its unused slots masked). Keys are cached `[B, K, H, S]` (slots last) and values
  `[B, K, S, H]`: on CPU a decode step's products then run over contiguous memory, about 8x
  faster at batch 16 than XLA's transposes of a `[B, S, K, H]` cache.
- `pallas`: the prefix by a split-K kernel that reads each row only up to its length
  (`prefix_pallas.py`), the new tokens' small T x T segment (causal, or a tree) by XLA, both
  merged by log-sum-exp. Keys and values are cached `[B, K, S, H]`; the kernel is written for the
  GPU's Triton backend and runs interpreted on CPU (tests, parity). Traced under a mesh (a
  rollout shard of tp devices, whose cache is split over kv heads), each device runs it on its
  own kv heads.

`default_impl` picks per backend: `pallas` on GPU, `xla` elsewhere. On TPU the `pallas` path is
refused: JAX's ragged paged-attention kernel for TPU takes a paged cache (pages and a page table
per row), which this contiguous per-row cache is not.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from tlt_jax.kernels.prefix_pallas import MIN_TILE, NEG, prefix_attention

IMPLS = ("xla", "pallas")
# The slot axis of the cached keys `[B, K, ., .]` in each cache layout: the implementations', and
# "invariant", the layout of a model in invariant numerics (`models.invariant`), which attends by
# key blocks of `INVARIANT_BLOCK` slots of `[B, K, H, S]` keys and `[B, K, S, H]` values.
KEY_SLOT_AXIS = {"xla": 3, "pallas": 2, "invariant": 3}
INVARIANT_BLOCK = 64


def default_impl(backend: str | None = None) -> str:
  """The implementation a backend runs when a config says "auto"."""
  return "pallas" if (backend or jax.default_backend()) == "gpu" else "xla"


def resolve_impl(name: str, backend: str | None = None) -> str:
  """"auto", "xla" or "pallas" to the implementation to run on `backend`, or a one-line
  error."""
  backend = backend or jax.default_backend()
  if name == "auto":
    return default_impl(backend)
  if name not in IMPLS:
    raise ValueError(f"Unknown attention implementation {name!r}; use 'auto', 'xla' or 'pallas'.")
  if name == "pallas" and backend == "tpu":
    raise ValueError("The pallas attention path targets GPUs (Triton); on TPU use 'xla' (JAX's "
                     "TPU ragged paged attention needs a paged cache).")
  return name


def cache_slots(slots: int, impl: str) -> int:
  """The slots a cache of at least `slots` slots gets in `impl`'s layout (the kernel's tiles, or
  the invariant attention's key blocks, are whole)."""
  granule = {"pallas": MIN_TILE, "invariant": INVARIANT_BLOCK}.get(impl, 1)
  return -(-slots // granule) * granule


def key_shape(batch: int, kv_heads: int, head_dim: int, slots: int, impl: str) -> tuple:
  """The cached keys' shape in `impl`'s layout (`[B, K, H, S]`, or `[B, K, S, H]` for pallas)."""
  return ((batch, kv_heads, slots, head_dim) if impl == "pallas"
          else (batch, kv_heads, head_dim, slots))


def to_cache_layout(k_BxTxKxH: jax.Array, v_BxTxKxH: jax.Array, impl: str = "xla"
                    ) -> tuple[jax.Array, jax.Array]:
  """Fresh keys and values from a projection in `impl`'s cache layout (T in the slot position;
  values `[B, K, T, H]`)."""
  k = k_BxTxKxH.transpose(0, 2, 1, 3) if impl == "pallas" else k_BxTxKxH.transpose(0, 2, 3, 1)
  return k, v_BxTxKxH.transpose(0, 2, 1, 3)


@dataclasses.dataclass(frozen=True)
class Prefix:
  """One layer's cached prefix: keys and values in `impl`'s layout, and each row's committed
  length `[B]` (the slots every new token attends to)."""

  k: jax.Array
  v_BxKxSxH: jax.Array
  lengths_B: jax.Array
  impl: str


def attention(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, mask_BxTxT, context=()) -> jax.Array:
  """Grouped-query softmax attention of T new tokens (each kv head serves N // K query heads)
  over their context and over themselves as `mask_BxTxT` allows. The context is a decode call's
  cached prefix (`Prefix`, either implementation), or, in a full forward, key/value segments
  `(k [B, K, H, S], v [B, K, S, H], mask [B, T, S])` in the `xla` layout (none, or a drafter's
  earlier depths in training). A step of more than 8 rows passes the prefix with its new
  entries already written (`Block`'s `write`, `kv_cache.row_by_row`), so that XLA updates the
  cache in place; only the slots below each row's length are read."""
  if isinstance(context, Prefix):
    if context.impl == "pallas":
      return _pallas(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, mask_BxTxT, context)
    s = context.v_BxKxSxH.shape[2]
    committed_BxS = jnp.arange(s)[None, :] < context.lengths_B[:, None]
    t = q_BxTxNxH.shape[1]
    context = ((context.k, context.v_BxKxSxH,
                jnp.broadcast_to(committed_BxS[:, None, :], (committed_BxS.shape[0], t, s))),)
  new = (*to_cache_layout(k_BxTxKxH, v_BxTxKxH), mask_BxTxT)
  return _xla(q_BxTxNxH, (*context, new))


def _rows(q_BxTxNxH, kh: int) -> jax.Array:
  """Queries `[B, K, G * T, H]`: kv head k's G query heads, each over the T tokens."""
  b, t, n, h = q_BxTxNxH.shape
  return q_BxTxNxH.reshape(b, t, kh, n // kh, h).transpose(0, 2, 3, 1, 4).reshape(b, kh, -1, h)


def _unrows(o_BxKxRxH, t: int) -> jax.Array:
  b, kh, r, h = o_BxKxRxH.shape
  return o_BxKxRxH.reshape(b, kh, r // t, t, h).transpose(0, 3, 1, 2, 4).reshape(b, t, -1, h)


def _xla(q_BxTxNxH, segments) -> jax.Array:
  """One softmax over the segments `(k [B, K, H, S], v [B, K, S, H], mask [B, T, S])` as if
  concatenated."""
  b, t, n, h = q_BxTxNxH.shape
  kh = segments[0][0].shape[1]
  q_BxKxRxH = _rows(q_BxTxNxH, kh)
  scores = []
  for k_BxKxHxS, _, mask_BxTxS in segments:
    s = jnp.einsum("bkqh,bkhs->bkqs", q_BxKxRxH, k_BxKxHxS,
                   preferred_element_type=jnp.float32) / jnp.sqrt(jnp.float32(h))
    # Additive, not `where`: a segment masked by a constant (an empty cache in a jitted prefill)
    # then stays data-dependent, which keeps XLA from constant-folding it (slow, at prefill size).
    bias_BxRxS = jnp.tile(jnp.where(mask_BxTxS, 0.0, jnp.finfo(jnp.float32).min), (1, n // kh, 1))
    scores.append(s + bias_BxRxS[:, None])
  sizes = [s.shape[-1] for s in scores]
  probs = jax.nn.softmax(jnp.concatenate(scores, axis=-1), axis=-1)
  out_BxKxRxH = 0
  for (_, v_BxKxSxH, _), p in zip(segments, jnp.split(probs, np.cumsum(sizes)[:-1], axis=-1)):
    out_BxKxRxH = out_BxKxRxH + jnp.einsum("bkqs,bksh->bkqh", p.astype(v_BxKxSxH.dtype),
                                           v_BxKxSxH)
  return _unrows(out_BxKxRxH, t)


def _prefix_kernel(q_BxKxRxH, k_BxKxSxH, v_BxKxSxH, lengths_B):
  # Chosen when the program is lowered, so a program lowered for a GPU elsewhere runs the kernel.
  return jax.lax.platform_dependent(
      q_BxKxRxH, k_BxKxSxH, v_BxKxSxH, lengths_B,
      cuda=functools.partial(prefix_attention, interpret=False),
      rocm=functools.partial(prefix_attention, interpret=False),
      default=functools.partial(prefix_attention, interpret=True))


def _over_kv_head_shards(kernel, kv_heads: int):
  """`kernel` run by each device of the mesh a program is traced under on its own kv heads
  (`[B, K, ...]` split over all the mesh's axes), as a tensor-parallel rollout shard holds its
  cache; the kernel is per (row, kv head), so nothing is exchanged. Without such a mesh, or with
  kv heads it cannot split evenly, the kernel as it is (the compiler would then gather its
  inputs: a custom call cannot be partitioned)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1 or kv_heads % mesh.size:
    return kernel
  heads = PartitionSpec(None, mesh.axis_names)
  return jax.shard_map(kernel, mesh=mesh, in_specs=(heads, heads, heads, PartitionSpec()),
                       out_specs=(heads, heads, heads), check_vma=False)


def _pallas(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, mask_BxTxT, prefix: Prefix) -> jax.Array:
  """The prefix by the kernel, the new tokens by XLA, merged by log-sum-exp."""
  t, n, h = q_BxTxNxH.shape[1:]
  kh = k_BxTxKxH.shape[2]
  q_BxKxRxH = _rows(q_BxTxNxH, kh)
  o_BxKxJxRxH, l_BxKxJxR, m_BxKxJxR = _over_kv_head_shards(_prefix_kernel, kh)(
      q_BxKxRxH, prefix.k, prefix.v_BxKxSxH, prefix.lengths_B)
  s_BxKxRxT = jnp.einsum("bkrh,btkh->bkrt", q_BxKxRxH, k_BxTxKxH,
                         preferred_element_type=jnp.float32) / jnp.sqrt(jnp.float32(h))
  mask_BxRxT = jnp.tile(mask_BxTxT, (1, n // kh, 1))
  s_BxKxRxT = jnp.where(mask_BxRxT[:, None], s_BxKxRxT, NEG)
  m_BxKxR = jnp.maximum(m_BxKxJxR.max(axis=2), s_BxKxRxT.max(axis=-1))
  p_BxKxRxT = jnp.exp(s_BxKxRxT - m_BxKxR[..., None])
  w_BxKxJxR = jnp.exp(m_BxKxJxR - m_BxKxR[:, :, None])
  num_BxKxRxH = ((o_BxKxJxRxH * w_BxKxJxR[..., None]).sum(axis=2)
                 + jnp.einsum("bkrt,btkh->bkrh", p_BxKxRxT, v_BxTxKxH.astype(jnp.float32)))
  den_BxKxR = (l_BxKxJxR * w_BxKxJxR).sum(axis=2) + p_BxKxRxT.sum(axis=-1)
  return _unrows(num_BxKxRxH / den_BxKxR[..., None], t).astype(v_BxTxKxH.dtype)
