"""The process group of a run that spans several processes (hosts): start-up, the checks that
every process runs the same run, and the few collectives the loop needs on host data.

JAX's multi-controller runtime (`jax.distributed`) runs the same program in every process; each
process drives its own devices (`jax.local_devices()`), and a program over a mesh that spans
processes runs as one SPMD computation. `initialize` starts it from the environment a cluster
scheduler sets (SLURM, cloud TPU: `jax.distributed.initialize()` finds the coordinator itself),
from `JAX_COORDINATOR_ADDRESS` / `JAX_NUM_PROCESSES` / `JAX_PROCESS_ID` (what
`experiments.launch_local` sets), or from the run config's `distributed` section (coordinator
and process count; the process id always comes from the environment, never from the config, so
every process runs the same command). One process: nothing starts and every helper below is the
identity, so a run on one host is unchanged.

On CPU the cross-process collectives are gloo's. A lost peer ends the survivors within
`heartbeat_timeout_s` (the coordination service aborts them), never a hang.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tlt_jax import jax_private
from tlt_jax.errors import ConfigError, first_line
from tlt_jax.typed import typed

_ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


class DistributedError(RuntimeError):
  """The process group could not start, or its processes disagree (e.g. on the config)."""


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """`coordinator_address` (host:port of process 0) and `num_processes`: empty/0 to take them
  from the environment (or run as one process when it names none); the timeouts bound start-up
  and how long a lost peer can go unnoticed."""

  coordinator_address: str = ""  # host:port of process 0 (empty: from the environment)
  num_processes: int = 0         # 0: from the environment, else one process
  initialization_timeout_s: int = 300  # seconds to wait for every process at start-up
  heartbeat_timeout_s: int = 100       # seconds before a lost peer ends the run

  def __post_init__(self):
    if self.num_processes < 0 or min(self.initialization_timeout_s, self.heartbeat_timeout_s) < 1:
      raise ConfigError(f"config.distributed: num_processes must be >= 0 (0: from the "
                        f"environment) and the timeouts >= 1 s; got {self}.")

  @classmethod
  def from_dict(cls, d, key: str = "distributed") -> "DistributedConfig":
    """From the optional `distributed` config section (absent: the defaults)."""
    return typed(cls, d or {}, key)


def _scheduler_detected() -> bool:
  """A cluster environment `jax.distributed.initialize()` reads by itself (several tasks)."""
  return int(os.environ.get("SLURM_NTASKS", "1")) > 1 or "TPU_WORKER_HOSTNAMES" in os.environ


def initialize(cfg: DistributedConfig = DistributedConfig()) -> int:
  """Starts the process group once (later calls return at once); returns the process count.
  Must run before anything touches a device."""
  if jax.distributed.is_initialized():
    return jax.process_count()
  env = {k: os.environ.get(k, "") for k in _ENV}
  address = cfg.coordinator_address or env["JAX_COORDINATOR_ADDRESS"]
  count = cfg.num_processes or int(env["JAX_NUM_PROCESSES"] or 0)
  if not address and not _scheduler_detected():
    if count > 1:
      raise DistributedError(f"{count} processes asked for but no coordinator address: set "
                             "config.distributed.coordinator_address or JAX_COORDINATOR_ADDRESS "
                             "(host:port of process 0), or start with experiments.launch_local.")
    return 1
  if address and (count < 1 or not env["JAX_PROCESS_ID"]):
    raise DistributedError(f"Coordinator {address} given but the process count or id is missing: "
                           "set JAX_NUM_PROCESSES (or config.distributed.num_processes) and "
                           "JAX_PROCESS_ID in every process's environment.")
  jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU only; others ignore it
  kwargs = dict(initialization_timeout=cfg.initialization_timeout_s,
                heartbeat_timeout_seconds=cfg.heartbeat_timeout_s)
  if address:
    kwargs.update(coordinator_address=address, num_processes=count,
                  process_id=int(env["JAX_PROCESS_ID"]))
  where = f"the coordinator at {address}" if address else "the scheduler's coordinator"
  fail = lambda why: DistributedError(
      f"Could not join the process group through {where} within "
      f"{cfg.initialization_timeout_s} s ({why}). Check that process 0 runs and that the address "
      "is reachable from this host.")
  if address and int(env["JAX_PROCESS_ID"] or 0) > 0 and not _reachable(
      address, cfg.initialization_timeout_s):  # jax's client would abort the process instead
    raise fail("nothing listens there")
  try:
    jax.distributed.initialize(**kwargs)
  except Exception as e:  # jax raises several types for an unreachable coordinator
    raise fail(first_line(e, 200)) from None
  return jax.process_count()


def _reachable(address: str, timeout_s: float) -> bool:
  """Whether a TCP connection to `address` (host:port) opens within `timeout_s`."""
  host, _, port = address.rpartition(":")
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
        return True
    except OSError:
      if time.monotonic() > deadline:
        return False
      time.sleep(0.5)


def is_writer() -> bool:
  """Whether this process writes the run's files (metrics, TensorBoard, exports): process 0."""
  return jax.process_index() == 0


_barriers = [0]


def barrier(name: str, timeout_s: int = 3600) -> None:
  """Waits until every process reaches its next barrier `name` (nothing to wait for in one
  process); a peer that never comes ends it with an error after `timeout_s`."""
  if jax.process_count() > 1:
    _barriers[0] += 1
    jax_private.wait_at_barrier(f"{name}:{_barriers[0]}", timeout_s * 1000)


def _differ(value: str) -> list[int]:
  """The processes whose `value` (up to 64 characters) differs from process 0's."""
  if jax.process_count() == 1:
    return []
  mine = np.frombuffer(value.encode().ljust(64)[:64], np.uint8)
  seen = multihost_utils.process_allgather(mine)
  return [i for i in range(len(seen)) if not np.array_equal(seen[i], seen[0])]


def same(value: str) -> bool:
  """Whether every process holds the same `value` (e.g. a weight hash)."""
  return not _differ(value)


def check_same(value: str, what: str) -> None:
  """Raises in every process unless all processes hold the same `value` (a short hash), e.g.
  the run config's: processes started with different commands stop before any work."""
  differ = _differ(value)
  if differ:
    raise DistributedError(f"Processes {differ} were started with a different {what} than "
                           "process 0; start every process with the same command and config.")


def share(n: int) -> slice:
  """This process's contiguous block of `n` items (`np.array_split` order: process 0 first)."""
  counts = shares(n)
  start = int(np.sum(counts[: jax.process_index()]))
  return slice(start, start + int(counts[jax.process_index()]))


def shares(n: int) -> np.ndarray:
  """How many of `n` items each process takes."""
  return np.array([len(b) for b in np.array_split(np.arange(n), jax.process_count())])


def gather_rows(local: dict, n: int) -> dict:
  """Every process's rows of `local` (arrays whose first axis is this process's `share(n)`),
  concatenated in process order: the whole `[n, ...]` arrays, on every process (one collective;
  shorter shares are padded for it and trimmed after)."""
  if jax.process_count() == 1:
    return local
  counts = shares(n)
  width = int(counts.max())
  padded = {k: np.pad(v, [(0, width - len(v))] + [(0, 0)] * (v.ndim - 1)) for k, v in
            local.items()}
  stacked = multihost_utils.process_allgather(padded)
  return {k: np.concatenate([v[p, :c] for p, c in enumerate(counts)]) for k, v in
          stacked.items()}


def first(value):
  """Process 0's `value` (a number or bool), on every process."""
  if jax.process_count() == 1:
    return value
  return type(value)(multihost_utils.broadcast_one_to_all(np.asarray(value)).item())


def total(value: float) -> float:
  """The sum of `value` over processes."""
  if jax.process_count() == 1:
    return value
  return float(np.sum(multihost_utils.process_allgather(np.asarray(value, np.float64))))


def mean_replicas(tree):
  """The mean over processes of each float leaf of `tree` (host-local arrays of the same shapes
  in every process), the maximum of each integer leaf (step counts), in one collective; the
  result is the same bits on every process."""
  if jax.process_count() == 1:
    return tree
  stacked = multihost_utils.process_allgather(jax.tree.map(np.asarray, tree))

  def merge(x, all_x):  # placed (and committed) as `x` was: the programs reading it stay built
    m = replica_mean(all_x)
    if not isinstance(x, jax.Array):
      return m
    return jax.device_put(m, x.sharding if x.committed else None)
  return jax.tree.map(merge, tree, stacked)


def replica_mean(stacked: np.ndarray) -> np.ndarray:
  """How replicas of one leaf (stacked on axis 0) merge: floats by their mean (computed in
  float64), integers (step counts) by their maximum."""
  if jnp.issubdtype(stacked.dtype, jnp.floating):  # bfloat16 too
    return stacked.mean(0, dtype=np.float64).astype(stacked.dtype)
  return stacked.max(0)


def warm_up() -> None:
  """Builds the programs of `first`, `total` and `same` (each process's first use of each
  would otherwise build one mid-run)."""
  if jax.process_count() > 1:
    first(False), total(0.0), same("")


def host(x) -> np.ndarray:
  """`x` (a possibly process-spanning array) as one numpy array on every process."""
  if jax.process_count() == 1 or x.is_fully_addressable or x.is_fully_replicated:
    return np.asarray(x)
  return multihost_utils.process_allgather(x, tiled=True)


def put(x: np.ndarray, sharding: NamedSharding) -> jax.Array:
  """Host `x` (the same on every process) as an array laid out by `sharding`, which may span
  processes: each process fills only its own devices' blocks."""
  x = np.asarray(x)
  if sharding.is_fully_addressable:
    return jax.device_put(x, sharding)
  return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def local_copy(tree, mesh: Mesh):
  """`tree` (arrays on `mesh`, which may span processes) whole on this process's first device
  of the mesh: one all-gather over the mesh, then a local array; no host round trip."""
  if jax.process_count() == 1:
    return tree
  return jax.tree.map(lambda x: x.addressable_data(0), _replicated(mesh)(tree))


@functools.lru_cache(maxsize=None)
def _replicated(mesh: Mesh):
  """The identity onto `mesh`, replicated (one program per tree structure, built once)."""
  return jax.jit(lambda t: t, out_shardings=NamedSharding(mesh, PartitionSpec()))


def spanning(tree, mesh: Mesh):
  """Host-local `tree` (the same values on every process) as arrays replicated over `mesh`,
  which spans processes: what a multi-process checkpoint saves and restores."""
  if jax.process_count() == 1:
    return tree
  return jax.tree.map(lambda x: put(np.asarray(x), NamedSharding(mesh, PartitionSpec())), tree)
