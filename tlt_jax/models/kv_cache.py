"""Static-shape KV cache with per-row lengths and slack for speculative writes.

Slot `j` of row `b` holds the key/value of the token at slot `j`; slots `< lengths_B[b]` are the
committed sequence. A layer attends to the committed slots and to its new tokens as two segments
(`kernels.attention`); its new entries are written in place, before the read or after it
(`row_by_row`). Values are stored `[B, K, S, H]`; keys in the layout of the attention
implementation the cache is for (`impl`): `[B, K, H, S]` (slots last) for `xla`, whose decode
products then run over contiguous memory on CPU, and `[B, K, S, H]` for the `pallas` kernel,
whose caches also round their slots up to whole kernel tiles; a model in invariant numerics gets
the "invariant" layout (`xla`'s, in whole key blocks) whatever the implementation. A call
writes its T new tokens at slots `lengths .. lengths + T - 1` *without* committing them: `commit`
then keeps an accepted subset (a chain prefix, or a tree path gathered into place) and advances
`lengths`. Writes never clamp: a write past the last slot raises at once when lengths are
concrete, and otherwise sets `overflow_B`, which `check_overflow` turns into an error at the next
host sync.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from tlt_jax.kernels.attention import KEY_SLOT_AXIS, Prefix, cache_slots, key_shape, to_cache_layout
from tlt_jax.models.bits import update_as_bits
from tlt_jax.models.config import ModelConfig


class CacheOverflowError(RuntimeError):
  """A write went past the last slot of the KV cache."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  """Per-layer keys (in `impl`'s layout) and values `[B, K, S, H]`, committed lengths `[B]`,
  overflow flags `[B]`, and the attention implementation it is laid out for (static)."""

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  lengths_B: jax.Array
  overflow_B: jax.Array
  impl: str = dataclasses.field(default="xla", metadata=dict(static=True))

  @property
  def batch(self) -> int:
    """Rows in the cache."""
    return self.lengths_B.shape[0]

  @property
  def max_len(self) -> int:
    """Slots per row."""
    return self.v[0].shape[2]

  def replace(self, **kwargs) -> "KVCache":
    """A copy with `changes` applied."""
    return dataclasses.replace(self, **kwargs)

  def prefix(self, layer: int) -> Prefix:
    """Layer `layer`'s committed prefix, as the attention seam reads it."""
    return Prefix(self.k[layer], self.v[layer], self.lengths_B, self.impl)


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None, impl: str = "xla"
               ) -> KVCache:
  """An empty cache of at least `max_len` slots for attention implementation `impl`, or, for a
  model in invariant numerics, which runs its own attention, in the "invariant" layout whatever
  `impl` says; k and v are separate buffers so that the cache can be donated."""
  dtype = jnp.dtype(dtype or cfg.dtype)
  if cfg.numerics == "invariant":
    impl = "invariant"
  slots = cache_slots(max_len, impl)
  k_shape = key_shape(batch, cfg.n_kv_heads, cfg.hd, slots, impl)
  v_shape = (batch, cfg.n_kv_heads, slots, cfg.hd)
  return KVCache(
      k=tuple(jnp.zeros(k_shape, dtype) for _ in range(cfg.n_layers)),
      v=tuple(jnp.zeros(v_shape, dtype) for _ in range(cfg.n_layers)),
      lengths_B=jnp.zeros((batch,), jnp.int32),
      overflow_B=jnp.zeros((batch,), bool),
      impl=impl,
  )


def _is_concrete(x) -> bool:
  return not isinstance(x, jax.core.Tracer)


def check_write(cache: KVCache, n_new: int) -> jax.Array:
  """Per-row flag of whether writing `n_new` tokens would pass the last slot.

  Raises `CacheOverflowError` immediately when the lengths are concrete (outside jit).
  """
  over_B = cache.lengths_B + n_new > cache.max_len
  if _is_concrete(over_B) and bool(np.any(np.asarray(over_B))):
    raise CacheOverflowError(
        f"KV cache write of {n_new} tokens past its end: row lengths "
        f"{np.asarray(cache.lengths_B).tolist()} with {cache.max_len} slots. Allocate a larger "
        "cache (max prompt + max new tokens + speculative slack).")
  return over_B


def _write(x, new, start_B, axis: int, per_row: bool):
  """Writes `new` into `x` at each row's own offset along `axis` (the slot axis): with
  `per_row`, one slice update per row, else one batched update (`row_by_row`); a half-precision
  cache as its bits (`bits.py`)."""
  def at(s):
    idx = [0] * (x.ndim - 1)
    idx[axis - 1] = s
    return idx

  def update(x, new):
    if per_row:
      for b in range(x.shape[0]):
        x = jax.lax.dynamic_update_slice(x, new[b:b + 1], (b, *at(start_B[b])))
      return x
    write_row = lambda row, new_row, s: jax.lax.dynamic_update_slice(row, new_row, tuple(at(s)))
    return jax.vmap(write_row)(x, new, start_B)

  return update_as_bits(update, x, new)


def write_kv(cache: KVCache, layer: int, k_new_BxTxKxH: jax.Array, v_new_BxTxKxH: jax.Array
             ) -> tuple[jax.Array, jax.Array]:
  """Layer `layer`'s keys and values with its T new entries written at each row's next slot.
  Up to 8 rows write row by row, except in the invariant layout, whose steps XLA:CPU then ran far
  slower (SmolLM2's decode step at 8 rows: 2.9x fast row by row, 1.4x batched)."""
  k_new, v_new = to_cache_layout(k_new_BxTxKxH, v_new_BxTxKxH, cache.impl)
  per_row = row_by_row(cache)
  return (_write(cache.k[layer], k_new, cache.lengths_B, KEY_SLOT_AXIS[cache.impl], per_row),
          _write(cache.v[layer], v_new, cache.lengths_B, 2, per_row))


def row_by_row(cache: KVCache) -> bool:
  """Whether `cache`'s writes go row by row (`_write`). A step reads such a cache before it
  writes into it, and otherwise after (`transformer.Block`'s `write`): either way XLA:CPU writes
  in place, where the other order copied the cache (a single row's, or a batched update's)."""
  return cache.lengths_B.shape[0] <= 8 and cache.impl != "invariant"


def new_tokens_mask(batch: int, n_new: int, tree_mask_TxT: jax.Array | None) -> jax.Array:
  """`[B, T, T]` mask of which new tokens each new token attends to: causal when
  `tree_mask_TxT` is None, else that tree (`[T, T]` shared, or `[B, T, T]` per row)."""
  if tree_mask_TxT is None:
    tree_mask_TxT = jnp.tril(jnp.ones((n_new, n_new), bool))
  return jnp.broadcast_to(tree_mask_TxT, (batch, n_new, n_new))


def commit(cache: KVCache, n_accept_B: jax.Array, accept_idx_BxA: jax.Array | None = None
           ) -> KVCache:
  """Keeps `n_accept_B[b]` of the tokens last written and advances the lengths.

  With `accept_idx_BxA` (indices among the last call's T new tokens, e.g. a tree path), the kept
  tokens are first copied into consecutive slots: each layer reads the A slots of the block it
  writes (a kept slot from its source, any other slot from itself) and writes the block back at
  the row's length, as a step writes its new tokens, so no other slot is read or written (a
  gather from a slots-first copy of each layer and a scatter back moved every slot); without it
  the kept tokens are a chain prefix that is already in place.
  """
  n_accept_B = jnp.asarray(n_accept_B, jnp.int32)
  if accept_idx_BxA is not None:
    a = accept_idx_BxA.shape[1]
    start_B = jnp.clip(cache.lengths_B, 0, max(cache.max_len - a, 0))  # the block fits the cache
    slot_BxA = start_B[:, None] + jnp.arange(a)[None, :]
    rel_BxA = slot_BxA - cache.lengths_B[:, None]
    kept_BxA = (rel_BxA >= 0) & (rel_BxA < n_accept_B[:, None])
    from_BxA = cache.lengths_B[:, None] + jnp.take_along_axis(
        accept_idx_BxA, jnp.clip(rel_BxA, 0, a - 1), axis=1)
    src_BxA = jnp.where(kept_BxA, from_BxA, slot_BxA)
    per_row = row_by_row(cache)

    def move(x, axis: int):
      """`x` with each row's block of A slots (slots on `axis`) read from `src_BxA`."""
      idx = src_BxA.reshape(src_BxA.shape[:1] + (1,) * (axis - 1) + src_BxA.shape[1:]
                            + (1,) * (x.ndim - axis - 1))
      return _write(x, jnp.take_along_axis(x, idx, axis=axis, mode="clip"), start_B, axis,
                    per_row)

    cache = cache.replace(k=tuple(move(k, KEY_SLOT_AXIS[cache.impl]) for k in cache.k),
                          v=tuple(move(v, 2) for v in cache.v))
  return cache.replace(lengths_B=cache.lengths_B + n_accept_B)


def check_overflow(cache: KVCache) -> None:
  """Raises if any write since allocation went past the cache end (call at host syncs)."""
  flags = np.asarray(cache.overflow_B)
  if flags.any():
    raise CacheOverflowError(
        f"KV cache overflow in rows {np.flatnonzero(flags).tolist()} ({cache.max_len} slots). "
        "Allocate a larger cache (max prompt + max new tokens + speculative slack).")
