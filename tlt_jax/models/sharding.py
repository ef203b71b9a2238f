"""Sharding by logical axes: each weight names the logical axis of each dimension (`embed`,
`vocab`, `heads`, `kv_heads`, `head_dim`, `mlp`, `norm`: `layers.param`), and `RULES` maps those
onto mesh axes.

Meshes: the update runs on `(data, fsdp, tp)` over the devices of every process (`tp` inside
a process, `fsdp` and `data` free to cross them); a rollout shard is a `(tp,)` sub-mesh
(`rollout/shards.py`). The model width (`embed`) splits over `fsdp` (fully sharded data
parallelism: every device holds a slice of every weight, gathered as a layer runs); heads, kv
heads, the MLP width and the vocabulary split over `tp` (tensor parallelism: each device computes
its own heads and MLP columns, with one reduction after the attention output and the MLP down
projection). An axis a mesh lacks, or of size 1, splits nothing. `tp` must divide the kv heads
and the MLP width (`check_tp`); where `fsdp` does not divide a dimension, it stays whole.
Activations shard their batch over `data` and `fsdp`.
"""

from __future__ import annotations

import math
from typing import Mapping

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tlt_jax.models.config import ModelConfig

DATA, FSDP, TP = "data", "fsdp", "tp"
MESH_AXES = (DATA, FSDP, TP)

# Logical axis -> mesh axis (None: whole on every device).
RULES: dict[str, str | None] = {
    "embed": FSDP, "vocab": TP, "heads": TP, "kv_heads": TP, "mlp": TP, "head_dim": None,
    "norm": None,
}


def make_mesh(data: int = 1, fsdp: int = 1, tp: int = 1, devices=None) -> Mesh:
  """The `(data, fsdp, tp)` mesh over `devices` (default: every device of every process); one
  axis may be -1 (every device left). `mesh_devices` says which devices and in what order."""
  if devices is not None:
    groups = [list(devices)]
  else:
    groups = [process_devices(p) for p in range(jax.process_count())]
  return Mesh(mesh_devices((data, fsdp, tp), groups), MESH_AXES)


def process_devices(p: int) -> list:
  """The devices process `p` drives, in id order (what its `jax.local_devices()` lists)."""
  return sorted((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id)


def mesh_devices(shape: tuple[int, int, int], groups: list[list]) -> np.ndarray:
  """The `(data, fsdp, tp)` array of devices of a global mesh of `shape` over `groups` (each
  process's devices, in process order). An explicit shape takes the same number of devices from
  each process, its first ones, process after process, so `tp` (innermost) is neighbouring
  devices of one process and `fsdp` and `data` may cross processes; one axis may be -1 (every
  device left). A shape the devices cannot hold, or cannot split evenly over the processes, is
  a `ValueError` in one line."""
  if list(shape).count(-1) > 1 or any(n < 1 and n != -1 for n in shape):
    raise ValueError(f"Mesh axes must be >= 1, with at most one -1 (every device left); got "
                     f"(data, fsdp, tp) = {tuple(shape)}.")
  procs, total = len(groups), sum(len(g) for g in groups)
  known = math.prod(n for n in shape if n != -1)
  if -1 in shape:
    if total % known:
      raise ValueError(f"(data, fsdp, tp) = {tuple(shape)}: the {total} devices do not split "
                       f"into groups of {known}; pick axes whose product divides {total}.")
    shape = tuple(total // known if n == -1 else n for n in shape)
  need = math.prod(shape)
  if need > total:
    raise ValueError(
        f"A mesh of data={shape[0]} x fsdp={shape[1]} x tp={shape[2]} needs {need} devices but "
        f"{total} are visible ({procs} process(es)). On CPU set "
        "XLA_FLAGS=--xla_force_host_platform_device_count=N before importing jax.")
  if need % procs or need // procs > min(len(g) for g in groups):
    raise ValueError(f"A mesh of {need} devices does not split evenly over the {procs} "
                     f"processes' {[len(g) for g in groups]} devices; use a multiple of {procs} "
                     "devices that each process has.")
  per = need // procs
  if per % shape[2]:
    raise ValueError(f"tp={shape[2]} does not divide the {per} devices each process gives the "
                     "mesh: a tensor-parallel group stays inside one process; lower tp.")
  return np.array([g[:per] for g in groups]).reshape(shape)


def check_tp(cfg: ModelConfig, tp: int) -> None:
  """A clear error, before any work, when `tp` cannot split the model's heads and MLP."""
  if tp < 1:
    raise ValueError(f"tp must be >= 1, got {tp}.")
  bad = [f"{name}={n}" for name, n in (("n_kv_heads", cfg.n_kv_heads), ("d_ff", cfg.d_ff))
         if n % tp]
  if bad:
    raise ValueError(f"tp={tp} does not divide the model's {' and '.join(bad)}: tensor "
                     "parallelism splits whole kv heads and MLP columns over tp devices; pick a "
                     "tp that divides both.")


def logical_axes(variable: nnx.Variable) -> tuple[str | None, ...]:
  """The logical axes a parameter declares (all None for one that declares none)."""
  axes = variable.get_metadata().get("axes")
  return tuple(axes) if axes is not None else (None,) * np.ndim(variable.get_value())


def spec(axes: tuple[str | None, ...], shape: tuple[int, ...], mesh_shape: Mapping[str, int],
         rules: dict[str, str | None] = RULES) -> P:
  """The `PartitionSpec` of a parameter of `shape` with logical `axes` on a mesh of
  `mesh_shape` (`mesh.shape`: axis name -> size)."""
  out = []
  for axis, size in zip(axes, shape):
    mesh_axis = rules.get(axis) if axis is not None else None
    n = mesh_shape.get(mesh_axis, 1) if mesh_axis is not None else 1
    out.append(mesh_axis if n > 1 and size % n == 0 and mesh_axis not in out else None)
  return P(*out)


def param_shardings(state, mesh: Mesh, rules: dict[str, str | None] = RULES):
  """`NamedSharding`s, in `state`'s structure, for a parameter state or an optimizer state
  built from one (its moments keep the parameters' axes; other leaves, e.g. step counts, are
  whole on every device)."""
  def one(x):
    if not isinstance(x, nnx.Variable):
      return NamedSharding(mesh, P())
    shape = np.shape(x.get_value())
    return x.replace(NamedSharding(mesh, spec(logical_axes(x), shape, mesh.shape, rules)))
  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
  """Rows split over the data-parallel axes (`data`, `fsdp`); other dimensions whole."""
  return NamedSharding(mesh, P((DATA, FSDP), *([None] * (ndim - 1))))
