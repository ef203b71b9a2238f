"""The policy from the update's mesh into every rollout shard's layout, without gathering it.

With several processes the update's arrays span processes (`train.mesh_shape`), while each
process's rollout shards are meshes of its own devices (`rollout/shards.py`). When the shards of
all processes together are exactly the update mesh's devices, each weight in turn is cast to the
compute dtype and laid out on the shard grid (`shard_grid`: a row per shard, every process's in
process order, a column per `tp` device) by one program over those devices: each device
receives its own shard's `tp` split, so no device holds a whole projection unless its shard is
one device. Each process then assembles its shards' arrays from the pieces already on its
devices, without copying. `moved_bytes` counts what a layout change brings to devices that
lacked it.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from tlt_jax.models.precision import compute_copy
from tlt_jax.models.sharding import TP, param_shardings, process_devices
from tlt_jax.rollout.shards import placed_shapes

REPLICA = "replica"


def shard_grid(meshes: list[Mesh]) -> Mesh | None:
  """The `(replica, tp)` mesh whose rows are the rollout shards of every process, assuming each
  process lays its shards out on its own devices as this one does (`meshes`); None when it
  cannot (processes with unequal device counts)."""
  own = process_devices(jax.process_index())
  positions = [[own.index(d) for d in m.devices.flat] for m in meshes]
  rows = []
  for p in range(jax.process_count()):
    devices = process_devices(p)
    if len(devices) != len(own):
      return None
    rows += [[devices[i] for i in row] for row in positions]
  return Mesh(np.array(rows), (REPLICA, TP))


def _spans(tree, mesh: Mesh) -> bool:
  """Whether every array of `tree` lives on exactly the devices of `mesh`."""
  devices = set(mesh.devices.flat)
  return all(isinstance(x, jax.Array) and x.sharding.device_set == devices
             for x in jax.tree.leaves(tree))


class Resharder:
  """Lays the update's policy out on this process's rollout shards (`meshes`) in `dtype`."""

  def __init__(self, meshes: list[Mesh], dtype):
    self.meshes, self.dtype = list(meshes), dtype
    self.grid = shard_grid(self.meshes)
    self._placed = None

  def placed(self, state):
    """`state`'s compute-dtype copy as `ShapeDtypeStruct`s laid out on the shard grid (worked
    out on the first call: a policy's shapes never change)."""
    if self._placed is None:
      out = jax.eval_shape(lambda s: compute_copy(s, self.dtype), state)
      self._placed = placed_shapes(out, param_shardings(out, self.grid))
    return self._placed

  def __call__(self, state) -> list | None:
    """`state` on every shard (a list, one tree per shard); None when the update's devices are
    not the shards' (then the caller gathers it). One weight at a time: XLA's partitioner
    reshards some layouts through a whole copy of the array on each device, and one weight's
    copy is all that ever exists."""
    if self.grid is None or not _spans(state, self.grid):
      return None
    leaves, treedef = jax.tree.flatten(state)
    on_grid = jax.tree.unflatten(treedef, [
        _cast_onto(p.sharding, str(p.dtype))(x)
        for x, p in zip(leaves, jax.tree.leaves(self.placed(state)))])
    return [jax.tree.map(functools.partial(_assembled, mesh=mesh), on_grid,
                         param_shardings(on_grid, mesh)) for mesh in self.meshes]


@functools.lru_cache(maxsize=None)
def _cast_onto(sharding: NamedSharding, dtype: str):
  """The jitted cast of one array to `dtype`, laid out by `sharding` (one program per shape)."""
  return jax.jit(lambda x: x.astype(dtype), out_shardings=sharding)


def _assembled(x: jax.Array, sharding: NamedSharding, mesh: Mesh) -> jax.Array:
  """The pieces of `x` on `mesh`'s devices as one array laid out by `sharding` (no copy)."""
  pieces = {s.device: s.data for s in x.addressable_shards}
  return jax.make_array_from_single_device_arrays(x.shape, sharding,
                                                  [pieces[d] for d in mesh.devices.flat])


def moved_bytes(tree, placed) -> int:
  """Bytes that laying `tree` out as `placed` (`ShapeDtypeStruct`s with shardings, in `tree`'s
  structure) brings to this process's devices: for each device, its new piece less the part of
  it the device already held, at the new dtype's width."""
  total = 0
  for x, dst in zip(jax.tree.leaves(tree), jax.tree.leaves(placed)):
    src_map = x.sharding.devices_indices_map(x.shape)
    for device, idx in dst.sharding.devices_indices_map(x.shape).items():
      if device.process_index != jax.process_index():
        continue
      held = _size(_overlap(idx, src_map[device], x.shape), x.shape) if device in src_map else 0
      total += (_size(idx, x.shape) - held) * np.dtype(dst.dtype).itemsize
  return total


def _overlap(a: tuple, b: tuple, shape) -> tuple:
  """The intersection of two index tuples (slices) of an array of `shape`."""
  out = []
  for sa, sb, n in zip(a, b, shape):
    lo = max(sa.indices(n)[0], sb.indices(n)[0])
    out.append(slice(lo, max(lo, min(sa.indices(n)[1], sb.indices(n)[1]))))
  return tuple(out)


def _size(idx: tuple, shape) -> int:
  return int(np.prod([len(range(*s.indices(n))) for s, n in zip(idx, shape)]))
