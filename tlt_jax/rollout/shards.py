"""Rollout shards as sub-meshes: shard `s` holds one copy of the model on its own devices.

Each shard is a `Mesh` over `devices_per_shard` (`EngineConfig.tp`) devices with the axis `tp`;
its weights, cache and inputs are placed with `NamedSharding`s on that mesh: the weights by their
logical axes (heads and MLP split over `tp`), the KV cache split over kv heads, everything else
whole on each device. The engine schedules shards the same whatever their size.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tlt_jax.models.sharding import TP

SHARD_AXES = (TP,)


def shard_meshes(devices, num_shards: int, devices_per_shard: int = 1) -> list[Mesh]:
  """`num_shards` disjoint meshes of `devices_per_shard` consecutive devices each."""
  devices = list(devices)
  need = num_shards * devices_per_shard
  if need > len(devices):
    raise ValueError(f"num_shards={num_shards} x {devices_per_shard} device(s) per shard needs "
                     f"{need} devices but {len(devices)} are visible (on CPU set "
                     "XLA_FLAGS=--xla_force_host_platform_device_count=N).")
  return [Mesh(np.array(devices[i * devices_per_shard: (i + 1) * devices_per_shard]), SHARD_AXES)
          for i in range(num_shards)]


def replicated(mesh: Mesh) -> NamedSharding:
  """The sharding of an array every device of the shard holds whole."""
  return NamedSharding(mesh, PartitionSpec())


def placed_shapes(shapes, shardings):
  """`shapes` (a pytree of arrays or `ShapeDtypeStruct`s) as `ShapeDtypeStruct`s placed by
  `shardings` (a pytree of the same structure): what a program is compiled ahead of time for."""
  return jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), shapes,
                      shardings)
