"""The two uses of JAX internals, in one place, checked against the JAX versions they were tested
with (`TESTED`, pyproject's range): the distributed client's barrier with a timeout (public
`multihost_utils.sync_global_devices` has none and runs a device collective) and XLA's compile
options for a device assignment (what `rollout/relocate.py` loads a serialised executable with).
Outside the range each raises one line saying so; `tests/test_jax_private.py` exercises both.
"""

from __future__ import annotations

import jax
import numpy as np

try:  # a JAX that moved these makes the two functions below raise, not the package's import
  from jax._src import compiler
  from jax._src import distributed as jax_distributed
except ImportError:  # pragma: no cover
  compiler = jax_distributed = None

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
