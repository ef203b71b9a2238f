"""Sharding specs for model weights on a `(data, fsdp)` mesh.

Weights are fully sharded (FSDP): each parameter's largest dimension that the `fsdp` axis size
divides is split over `fsdp`; everything else is replicated. Activations shard their batch over
both axes. The same rule serves the policy, its optimizer state and the drafter.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA, FSDP = "data", "fsdp"


def make_mesh(data: int = 1, fsdp: int = 1, devices=None) -> Mesh:
  """A `(data, fsdp)` mesh over the first `data * fsdp` devices, with a clear error if short."""
  devices = list(jax.devices() if devices is None else devices)
  need = data * fsdp
  if data < 1 or fsdp < 1:
    raise ValueError(f"Mesh axes must be >= 1, got data={data}, fsdp={fsdp}.")
  if need > len(devices):
    raise ValueError(
        f"A mesh of data={data} x fsdp={fsdp} needs {need} devices but {len(devices)} are visible. "
        "On CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N before importing jax.")
  return Mesh(np.array(devices[:need]).reshape(data, fsdp), (DATA, FSDP))


def param_spec(shape: tuple[int, ...], fsdp_size: int) -> P:
  """FSDP spec of one parameter: its largest divisible dimension over `fsdp`."""
  if fsdp_size <= 1 or not shape:
    return P()
  for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
    if shape[dim] % fsdp_size == 0:
      spec = [None] * len(shape)
      spec[dim] = FSDP
      return P(*spec)
  return P()


def param_shardings(state, mesh: Mesh):
  """`NamedSharding`s for every leaf of a parameter (or optimizer-state) pytree."""
  fsdp_size = mesh.shape[FSDP]
  return jax.tree.map(lambda x: NamedSharding(mesh, param_spec(tuple(x.shape), fsdp_size)), state)


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
  """Rows split over all devices of the mesh; other dimensions replicated."""
  return NamedSharding(mesh, P((DATA, FSDP), *([None] * (ndim - 1))))
