"""Moves a compiled executable onto other devices without compiling it again.

Rollout shards run the same programs on different devices. XLA's machine code for a shard does
not depend on which device it runs on, only its device assignment does, but JAX keys compiled
programs (in memory and, on CPU, in its persistent cache) by their devices, so every shard would
compile every program again. `relocate` serialises an executable and loads it back with the
other shard's device assignment instead: milliseconds instead of a compile.

It reaches into JAX's executable serialisation through `tlt_jax.jax_private` (every use of JAX
internals lives there); a JAX version where that fails makes `relocate` raise,
and the pool then compiles as before. On CPU an executable that was itself deserialised does not
serialise whole (its functions go missing), so `relocate` takes the serialised form the pool got
at compile time or read from its cache, not a loaded executable.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax

from tlt_jax import jax_private


def device_ids(compiled) -> list[int]:
  """The ids of the devices an executable's inputs live on, in order."""
  return sorted({d.id for sh in jax.tree.leaves(compiled.input_shardings) for d in sh.device_set})


def relocate(serialized: tuple, source: Sequence[int], devices: Sequence[Any]):
  """The executable `serialized` (`serialize_executable.serialize`'s output for a program
  compiled for the device ids `source`), loaded onto `devices`: `source[i]` maps to
  `devices[i]`."""
  if len(source) != len(devices):
    raise ValueError(f"cannot move a program on {len(source)} devices onto {len(devices)}")
  payload, in_tree, out_tree = serialized
  unloaded, args_info, no_kwargs = jax_private.load_executable(payload, list(devices),
                                                              dict(zip(source, devices)))
  return jax.stages.Compiled(unloaded.load(), [], in_tree.unflatten(args_info), out_tree,
                             no_kwargs=no_kwargs)
