"""The uses of JAX internals, in one place, checked against the JAX versions they were tested
with (`TESTED`, pyproject's range): the distributed client's barrier with a timeout (public
`multihost_utils.sync_global_devices` has none and runs a device collective), XLA's compile
options for a device assignment, and loading a serialised executable onto other devices with
them (JAX's private unpickler; what `rollout/relocate.py` moves programs between shards with).
Outside the range each raises one line saying so; `tests/test_jax_private.py` and the
relocation tests exercise them.
"""

from __future__ import annotations

import io

import jax
import numpy as np

try:  # a JAX that moved these makes the functions below raise, not the package's import
  from jax._src import compiler
  from jax._src import distributed as jax_distributed
  from jax.experimental import serialize_executable
except ImportError:  # pragma: no cover
  compiler = jax_distributed = serialize_executable = None

TESTED = ((0, 10), (0, 13))  # [lowest, highest): major.minor of the JAX releases tested


def _check() -> None:
  version = tuple(int(x) for x in jax.__version__.split(".")[:2])
  if compiler is None or not TESTED[0] <= version < TESTED[1]:
    raise RuntimeError(f"jax {jax.__version__} is outside the range tlt_jax's uses of JAX "
                       f"internals were tested with ({'.'.join(map(str, TESTED[0]))} to below "
                       f"{'.'.join(map(str, TESTED[1]))}); install a jax in that range.")


def wait_at_barrier(name: str, timeout_ms: int) -> None:
  """Blocks until every process of the run reaches the barrier `name`, or raises after
  `timeout_ms`."""
  _check()
  jax_distributed.global_state.client.wait_at_barrier(name, timeout_ms)


def compile_options(num_partitions: int, device_ids):
  """XLA compile options for one replica partitioned over the devices `device_ids`."""
  _check()
  return compiler.get_compile_options(num_replicas=1, num_partitions=num_partitions,
                                      device_assignment=np.array([list(device_ids)]))


def load_executable(payload: bytes, devices, moves: dict):
  """A serialised executable's pickled payload (`serialize_executable.serialize`'s first part)
  loaded with its devices replaced by `moves` (old device id -> device) and compiled for
  `devices`: (the unloaded executable, its args info, whether it takes no kwargs)."""
  _check()

  class Unpickler(serialize_executable._JaxPjrtUnpickler):  # pylint: disable=protected-access

    def __init__(self):
      super().__init__(io.BytesIO(payload), devices[0].client, list(devices))
      self.devices_by_id = moves
      self.options = compile_options(len(devices), [d.id for d in devices])

    def persistent_load(self, pid):
      if pid[0] == "exec":
        return self.backend.deserialize_executable(
            pid[1], executable_devices=self.execution_devices, compile_options=self.options)
      return super().persistent_load(pid)

  return Unpickler().load()
