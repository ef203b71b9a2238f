"""Counts the XLA programs this process builds, from `jax.monitoring`'s backend-compile events.

JAX records one such event each time it must produce an executable that is not already in
memory: a real compile or a load from its persistent cache. Any jitted function, eager op or AOT
executable counts, so this measures the promise that after warm-up an RL step builds nothing,
not only the `ExecutablePool`'s own bookkeeping.

It also counts, per thread, the programs JAX took from its persistent cache: on CPU such a
deserialised executable does not serialise whole again (functions go missing when it is loaded
once more), so the pool neither stores nor moves one.
"""

from __future__ import annotations

import threading

import jax

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"

_lock = threading.Lock()
_totals = {"events": 0, "seconds": 0.0}
_installed = False
_thread = threading.local()


def _listener(event: str, duration_secs: float, **kwargs) -> None:
  del kwargs
  if event == BACKEND_COMPILE_EVENT:
    with _lock:
      _totals["events"] += 1
      _totals["seconds"] += duration_secs


def _hit_listener(event: str, **kwargs) -> None:
  del kwargs
  if event == CACHE_HIT_EVENT:  # recorded on the thread that asked for the program
    _thread.hits = getattr(_thread, "hits", 0) + 1


def install() -> None:
  """Starts counting (once per process; later calls do nothing)."""
  global _installed
  with _lock:
    if _installed:
      return
    _installed = True
  jax.monitoring.register_event_duration_secs_listener(_listener)
  jax.monitoring.register_event_listener(_hit_listener)


def totals() -> tuple[int, float]:
  """(programs built, seconds spent building them) since `install()`."""
  install()
  with _lock:
    return _totals["events"], _totals["seconds"]


def thread_cache_hits() -> int:
  """Programs this thread took from JAX's persistent cache since `install()`."""
  install()
  return getattr(_thread, "hits", 0)


class Since:
  """Programs built since this object was made: `Since().events`, `.seconds`."""

  def __init__(self):
    self._events, self._seconds = totals()

  @property
  def events(self) -> int:
    """XLA programs built since this object was made."""
    return totals()[0] - self._events

  @property
  def seconds(self) -> float:
    """Seconds spent building them."""
    return totals()[1] - self._seconds
