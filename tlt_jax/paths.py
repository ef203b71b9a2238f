"""Where a run writes: run directories, their metrics and checkpoints, exports and caches, as
`etils.epath` paths (orbax uses them too). A local folder and, where epath's backend for it is
installed, a remote one (`gs://bucket/run`) go through the same calls; the tests cover local
paths and `gs://` served by an in-memory filesystem, no real bucket. Model folders and datasets
that a run reads are local files. A cache entry that several processes may build at once
(a warm start, a warm-up drafter) is built under `exclusive`."""

from __future__ import annotations

import contextlib
import fcntl
import os

import numpy as np
from etils import epath
from safetensors.numpy import save, save_file


def is_remote(path: str | os.PathLike) -> bool:
  """Whether `path` names a remote filesystem (`scheme://...`) rather than a local folder."""
  return "://" in os.fspath(path)


def as_path(path: str | os.PathLike) -> epath.Path:
  """`path` as an epath path: a local one absolute and normalised (a run launched from another
  working directory, or spelled another way, is the same folder), a remote one (`scheme://...`)
  as given."""
  if is_remote(path):
    return epath.Path(path)
  return epath.Path(os.path.abspath(path))


def write_whole(path: epath.Path, data: str | bytes) -> None:
  """Writes `data` to `path` whole: into a temporary file beside it, then renamed over it, so a
  reader (another process, or a later run after a crash) never sees half of it."""
  tmp = path.parent / f"{path.name}.{os.getpid()}.tmp"
  tmp.write_bytes(data.encode() if isinstance(data, str) else data)
  tmp.replace(path)


def open_appending(path: epath.Path):
  """`path` open for writing after what it holds: appended to where the filesystem can (a local
  file), else rewritten with its earlier text first (object stores such as GCS have no append;
  their object then appears when the file is closed)."""
  if not is_remote(path):
    return path.open("a")
  earlier = path.read_text() if path.exists() else ""
  f = path.open("w")
  f.write(earlier)
  return f


def write_safetensors(tensors: dict[str, np.ndarray], path: epath.Path, metadata: dict) -> None:
  """`tensors` as a safetensors file at `path`: streamed to a local file, or built in memory and
  written whole to a remote one. (safetensors writes an array's buffer as it lies: a transposed
  view would be written in its base's order, so every array is made C-contiguous first.)"""
  tensors = {name: np.ascontiguousarray(arr) for name, arr in tensors.items()}
  if is_remote(path):
    path.write_bytes(save(tensors, metadata=metadata))
  else:
    save_file(tensors, os.fspath(path), metadata=metadata)


@contextlib.contextmanager
def exclusive(path: str | os.PathLike):
  """Holds an exclusive lock on the cache entry `path` (a local one: `<path>.lock`, which stays
  behind), so that processes sharing a cache (a sweep, a test suite's workers) build an entry
  once: the others wait, then find it built. A remote entry is not locked."""
  if is_remote(path):
    yield
    return
  lock = os.path.abspath(os.fspath(path)) + ".lock"
  os.makedirs(os.path.dirname(lock), exist_ok=True)
  with open(lock, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)
