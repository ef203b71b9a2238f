"""Half-precision buffers updated as their bits.

jax 0.10's XLA:CPU runs a dynamic-update-slice or scatter into a bfloat16 or float16 buffer
through a float32 copy of the whole buffer (converted there and back at every write); the same
update of the buffer's bits (uint16) runs in place. jax 0.11 writes either in place. The KV
cache and the rollout's captured hidden states are updated as their bits inside the step that
reads them (XLA fuses the reinterpretation into the update); the drafter's ring of hidden states,
written by programs of its own, is kept as its bits (`storage_dtype`).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def storage_dtype(dtype) -> jnp.dtype:
  """The dtype a buffer of `dtype` values is kept in: uint16 for a 2-byte float, else `dtype`."""
  dtype = jnp.dtype(dtype)
  return jnp.dtype(jnp.uint16) if _half(dtype) else dtype


def to_storage(x: jax.Array) -> jax.Array:
  """`x` as `storage_dtype(x.dtype)` (the same bits)."""
  return jax.lax.bitcast_convert_type(x, jnp.uint16) if _half(x.dtype) else x


def from_storage(x: jax.Array, dtype) -> jax.Array:
  """The `dtype` values that `to_storage` kept as `x`."""
  dtype = jnp.dtype(dtype)
  return jax.lax.bitcast_convert_type(x, dtype) if _half(dtype) else x


def update_as_bits(update: Callable[[jax.Array, jax.Array], jax.Array], x: jax.Array,
                   new: jax.Array) -> jax.Array:
  """`update(x, new)` (a function that writes `new` into `x`), with `new` cast to `x`'s dtype
  and a 2-byte float `x` updated as its bits, so the same values land in place."""
  return from_storage(update(to_storage(x), to_storage(new.astype(x.dtype))), x.dtype)


def _half(dtype) -> bool:
  return jnp.dtype(dtype).itemsize == 2 and jnp.issubdtype(dtype, jnp.floating)
