"""`ExecutablePool`: ahead-of-time compiled executables keyed by (mode, batch bucket, ...).

The XLA analogue of a CUDA-graph pool: each key is lowered and compiled once
(`jax.jit(fn).lower(*abstract_args).compile()`), weights and state are arguments (state donated),
so new weights reuse the executables. Keys are compiled lazily on first use or ahead of time on a
background thread. The pool records compile seconds and `memory_analysis()` bytes per key.

With a cache directory, compiled executables are also serialised there, keyed by the pool key and
a fingerprint of everything else that shapes the program (model config, weight shapes, devices,
jax version, this package's source). A fresh process then loads them instead of tracing, lowering
and compiling again: for a 30-layer model, tracing and lowering alone cost seconds per key, which
JAX's persistent compilation cache (also configured here) does not save.

A key may name twins: the same program on other devices (other rollout shards). Once one twin is
built, the key's executable is that one moved onto its own devices (`relocate`), not compiled
again.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import pickle
import threading
import time
from typing import Any, Callable, Hashable, Sequence

import jax
from jax.experimental.serialize_executable import deserialize_and_load, serialize
from tqdm import tqdm

from tlt_jax.hashing import content_digest
from tlt_jax.paths import as_path, write_whole
from tlt_jax.rollout import compiles
from tlt_jax.rollout.relocate import device_ids, relocate


def use_compilation_cache(directory: str = "", fallback: str = "") -> str:
  """The one place tlt_jax sets JAX's persistent compilation cache, called by every launcher
  (`experiments/launch.run`) before anything compiles: `directory` where given, else the one the
  process already has (the environment's `JAX_COMPILATION_CACHE_DIR`, or an earlier call), else
  `fallback`; small programs are cached too. Returns the directory in use ('' for none). An engine
  keeps its executables under its `compile_cache_dir`, else under this one."""
  directory = directory or jax.config.jax_compilation_cache_dir or fallback
  if directory:
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return directory or ""


def compile_threads() -> int:
  """Threads a warm-up compiles on: XLA compiles a program on one thread, so a warm-up of many
  programs uses every core (at most 8)."""
  return min(8, os.cpu_count() or 1)


def warm_concurrently(calls: Sequence[Callable[[], Any]]) -> None:
  """Calls each of `calls` once (each the first call of its own programs, which compiles them),
  on `compile_threads()` threads, and waits for their results: XLA compiles each program on its
  caller's thread, so independent warm-ups overlap their compiles (an H200 box's 16 cores
  compile 8 at once). Calls must not share donated buffers."""
  with concurrent.futures.ThreadPoolExecutor(compile_threads(),
                                             thread_name_prefix="warm-up") as pool:
    for result in pool.map(lambda call: call(), calls):
      jax.block_until_ready(result)


@dataclasses.dataclass
class CompileEvent:
  """One executable the pool built: compiled, loaded from its cache, or moved from a twin."""

  key: Hashable
  seconds: float
  at: float
  memory_bytes: int
  loaded: bool = False  # deserialised from the executable cache instead of compiled
  relocated: bool = False  # its twin's executable, moved onto this key's devices


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

  def __init__(self, background_threads: int = 0, cache_dir: str = "", fingerprint: str = "",
               twins: bool = False):
    background_threads = background_threads or compile_threads()  # 0: every core
    self.cache_dir = as_path(cache_dir) / "executables" if cache_dir else None
    self.fingerprint = fingerprint
    self._compiled: dict[Hashable, Any] = {}
    self._futures: dict[Hashable, concurrent.futures.Future] = {}
    # Keys may name twins (`get`): keep each executable's serialised form and device ids, taken
    # when it is compiled or read (on CPU a program that has run may no longer serialise).
    self.twins = twins
    self._serialized: dict[Hashable, tuple] = {}
    self._lock = threading.Lock()
    self._executor = concurrent.futures.ThreadPoolExecutor(background_threads,
                                                           thread_name_prefix="pool-compile")
    self.events: list[CompileEvent] = []

  def _path(self, key):
    return self.cache_dir / f"{content_digest([self.fingerprint, repr(key)], 32)}.exe"

  def _load(self, key):
    path = self._path(key) if self.cache_dir is not None else None
    if path is None or not path.exists():
      return None
    try:
      payload, ids = pickle.loads(path.read_bytes())
      by_id = {d.id: d for d in jax.devices()}
      # The devices it was compiled for (by default it would be loaded onto all of them).
      compiled = deserialize_and_load(*payload, execution_devices=[by_id[i] for i in ids])
      if self.twins:
        with self._lock:
          self._serialized[key] = payload, ids
      return compiled
    except Exception as e:  # a damaged entry is recompiled and rewritten, never fatal
      logging.warning("executable cache entry %s unreadable (%s); recompiling", path, e)
      return None

  def _store(self, key, compiled) -> None:
    """Keeps the serialised executable for twins and writes it to the executable cache."""
    if self.cache_dir is None and not self.twins:
      return
    try:
      serialized = serialize(compiled), device_ids(compiled)
    except Exception as e:  # some backends cannot serialise: the pool still works
      logging.warning("could not serialise executable %s: %s", key, e)
      return
    if self.twins:
      with self._lock:
        self._serialized[key] = serialized
    if self.cache_dir is None:
      return
    try:
      self.cache_dir.mkdir(parents=True, exist_ok=True)
      write_whole(self._path(key), pickle.dumps(serialized))
    except OSError as e:  # a full or read-only disk: the pool still works
      logging.warning("could not cache executable %s: %s", key, e)

  def _twin_serialized(self, twins):
    """The serialised executable and device ids of a twin that is built, else of one being
    built (waits for it), else None (none built, or it could not serialise). A twin still
    queued is not waited for: the thread that would build it may be this one."""
    with self._lock:
      built = [t for t in twins if t in self._serialized]
      if built:
        return self._serialized[built[0]]
      running = [f for f in map(self._futures.get, twins) if f is not None and f.running()]
    if not running:
      return None
    running[0].result()
    with self._lock:
      return next((self._serialized[t] for t in twins if t in self._serialized), None)

  def _relocated(self, key, build, twins):
    """A built twin's executable moved onto the devices of `key`'s arguments, or None."""
    try:
      source = self._twin_serialized(twins)
      if source is None:
        return None
      _, args, _ = build()
      by_id = {d.id: d for d in jax.devices()}
      ids = sorted({d.id for a in jax.tree.leaves(args) for d in a.sharding.device_set})
      return relocate(*source, [by_id[i] for i in ids])
    except Exception as e:  # a JAX version whose serialisation differs: compile instead
      logging.debug("could not move executable %s onto its devices (%s); compiling", key, e)
      return None

  def _compile(self, key, build: Callable[[], tuple], twins: Sequence[Hashable] = ()) -> Any:
    start = time.perf_counter()
    compiled = self._relocated(key, build, twins) if twins else None
    relocated = compiled is not None
    if not relocated:
      compiled = self._load(key)
    loaded = compiled is not None and not relocated
    if compiled is None:
      fn, args, donate = build()
      hits = compiles.thread_cache_hits()
      compiled = jax.jit(fn, donate_argnums=donate).lower(*args).compile()
      if compiles.thread_cache_hits() == hits:  # JAX's cached programs do not serialise whole
        self._store(key, compiled)
    seconds = time.perf_counter() - start
    with self._lock:
      self._compiled[key] = compiled
      self.events.append(CompileEvent(key, seconds, time.time(), _memory_bytes(compiled), loaded,
                                      relocated))
    return compiled

  def get(self, key: Hashable, build: Callable[[], tuple],
          twins: Sequence[Hashable] = ()) -> Any:
    """The executable of `key`: built before, being built (waits), moved from one of `twins`
    (keys of the same program on other devices), loaded from the executable cache or compiled
    now."""
    with self._lock:
      if key in self._compiled:
        return self._compiled[key]
      future = self._futures.get(key)
    if future is not None:
      return future.result()
    return self._compile(key, build, twins)

  def precompile(self, key: Hashable, build: Callable[[], tuple],
                 twins: Sequence[Hashable] = ()) -> None:
    """Builds `key` on a background thread unless it is built or in flight; submit one twin
    before the keys that name it, so that it is under way when they need it."""
    with self._lock:
      if key in self._compiled or key in self._futures:
        return
      self._futures[key] = self._executor.submit(self._compile, key, build, twins)

  def compiling(self) -> bool:
    """Whether a background compile is in flight (it shares the host with the dispatches)."""
    with self._lock:
      return any(not f.done() for f in self._futures.values())

  def wait(self, progress: bool = False, desc: str = "compile") -> None:
    """Blocks until every background compile is done (with a progress bar if asked)."""
    futures = list(self._futures.values())
    with tqdm(total=len(futures), desc=desc, disable=not progress or not futures,
              mininterval=1.0) as bar:
      for f in concurrent.futures.as_completed(futures):
        f.result()
        bar.update()

  def __contains__(self, key) -> bool:
    return key in self._compiled

  def __len__(self) -> int:
    return len(self._compiled)

  def keys(self) -> list:
    """The keys of the executables held."""
    return list(self._compiled)

  def report(self) -> dict:
    """How many executables were compiled, loaded or moved, and the seconds each took."""
    return {"executables": len(self._compiled),
            "compile_s": round(sum(e.seconds for e in self.events), 3),
            "loaded_from_cache": sum(e.loaded for e in self.events),
            "relocated": sum(e.relocated for e in self.events),
            "memory_bytes": {str(e.key): e.memory_bytes for e in self.events}}
