"""Half-precision buffers updated as their bits.

jax 0.10's XLA:CPU runs a dynamic-update-slice or scatter into a bfloat16 or float16 buffer
through a float32 copy of the whole buffer (converted there and back at every write); the same
update of the buffer's bits (uint16) runs in place. jax 0.11's XLA:CPU writes a bf16 buffer in
place, and there the reinterpretation itself costs a copy outside the update's fusion, so the KV
cache and the rollout's captured hidden states are updated as their bits only where the round
trip is (`update_as_bits`). The drafter's ring of hidden states, written by programs of its own,
is kept as its bits on every backend (`storage_dtype`): there only the rows written and read are
reinterpreted.
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
  """`update(x, new)` (a function that writes `new` into `x`), with `new` cast to `x`'s dtype;
  a 2-byte float `x` is updated as its bits where XLA would otherwise write it through float32
  (jax before 0.11, on CPU), so the same values land in place."""
  new = new.astype(x.dtype)
  if not (_half(x.dtype) and _widens_half_writes()):
    return update(x, new)
  return from_storage(update(to_storage(x), to_storage(new)), x.dtype)


def _widens_half_writes() -> bool:
  """Whether XLA writes into a 2-byte float buffer through a float32 copy of it: jax 0.10's
  XLA:CPU does."""
  return jax.__version_info__ < (0, 11) and jax.default_backend() == "cpu"


def _half(dtype) -> bool:
  return jnp.dtype(dtype).itemsize == 2 and jnp.issubdtype(dtype, jnp.floating)
