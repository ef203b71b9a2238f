"""`ExecutablePool`: ahead-of-time compiled executables keyed by (mode, batch bucket, ...).

The XLA analogue of a CUDA-graph pool: each key is lowered and compiled once
(`jax.jit(fn).lower(*abstract_args).compile()`), weights and state are arguments (state donated),
so new weights reuse the executables. Keys are compiled lazily on first use or ahead of time on a
background thread. The pool records compile seconds and `memory_analysis()` bytes per key.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from typing import Any, Callable, Hashable

import jax


def configure_compilation_cache(directory: str) -> None:
  """Points JAX's persistent compilation cache at `directory`, caching even small programs."""
  if not directory:
    return
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@dataclasses.dataclass
class CompileEvent:
  key: Hashable
  seconds: float
  at: float
  memory_bytes: int


def _memory_bytes(compiled) -> int:
  try:
    m = compiled.memory_analysis()
  except Exception:  # not every backend implements it
    return 0
  if m is None:
    return 0
  return int(sum(getattr(m, f, 0) or 0 for f in (
      "argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
      "generated_code_size_in_bytes")) - (getattr(m, "alias_size_in_bytes", 0) or 0))


class ExecutablePool:
  """Compiled executables by key; `get(key, build)` compiles `build()` on first use.

  `build()` returns `(fn, abstract_args, donate_argnums)`.
  """

  def __init__(self, background_threads: int = 1):
    self._compiled: dict[Hashable, Any] = {}
    self._futures: dict[Hashable, concurrent.futures.Future] = {}
    self._lock = threading.Lock()
    self._executor = concurrent.futures.ThreadPoolExecutor(max(1, background_threads),
                                                           thread_name_prefix="pool-compile")
    self.events: list[CompileEvent] = []

  def _compile(self, key, build: Callable[[], tuple]) -> Any:
    fn, args, donate = build()
    start = time.perf_counter()
    compiled = jax.jit(fn, donate_argnums=donate).lower(*args).compile()
    seconds = time.perf_counter() - start
    with self._lock:
      self._compiled[key] = compiled
      self.events.append(CompileEvent(key, seconds, time.time(), _memory_bytes(compiled)))
    return compiled

  def get(self, key: Hashable, build: Callable[[], tuple]) -> Any:
    with self._lock:
      if key in self._compiled:
        return self._compiled[key]
      future = self._futures.get(key)
    if future is not None:
      return future.result()
    return self._compile(key, build)

  def precompile(self, key: Hashable, build: Callable[[], tuple]) -> None:
    """Compiles `key` on the background thread unless it is compiled or in flight."""
    with self._lock:
      if key in self._compiled or key in self._futures:
        return
      self._futures[key] = self._executor.submit(self._compile, key, build)

  def wait(self) -> None:
    for f in list(self._futures.values()):
      f.result()

  def __contains__(self, key) -> bool:
    return key in self._compiled

  def __len__(self) -> int:
    return len(self._compiled)

  def keys(self) -> list:
    return list(self._compiled)

  def report(self) -> dict:
    return {"executables": len(self._compiled),
            "compile_s": round(sum(e.seconds for e in self.events), 3),
            "memory_bytes": {str(e.key): e.memory_bytes for e in self.events}}
