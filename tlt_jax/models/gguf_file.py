"""A GGUF file's metadata and tensors, read in one pass (little-endian GGUF v2 and v3).

`gguf.GGUFReader` turns every element of every metadata array into a memory-mapped view, which
took 11 s for SmolLM2's 49,152 tokens and 48,900 merges; here each string is one slice of the
file's bytes (well under a second). Tensors stay in the file, memory-mapped, as their raw bytes
in `gguf.quants.dequantize`'s layout; the `gguf` package still dequantises them.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType

_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
# GGUF value types with a fixed size: struct format by type number.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}


@dataclasses.dataclass(frozen=True)
class GGUFTensor:
  """One tensor: its type, its shape (row-major, the file's dimensions reversed) and its bytes,
  shaped (..., bytes per row)."""
  type: GGMLQuantizationType
  shape: tuple[int, ...]
  data: np.ndarray


@dataclasses.dataclass(frozen=True)
class GGUFFile:
  metadata: dict[str, Any]
  tensors: dict[str, GGUFTensor]


class _Cursor:
  def __init__(self, buf: memoryview):
    self.buf, self.pos = buf, 0

  def unpack(self, fmt: str) -> Any:
    value = struct.unpack_from("<" + fmt, self.buf, self.pos)[0]
    self.pos += struct.calcsize("<" + fmt)
    return value

  def string(self) -> str:
    n = self.unpack("Q")
    self.pos += n
    return bytes(self.buf[self.pos - n:self.pos]).decode("utf-8")

  def value(self, kind: int) -> Any:
    if kind == _STRING:
      return self.string()
    if kind == _ARRAY:
      item, count = self.unpack("I"), self.unpack("Q")
      if item in _SCALARS:  # one read for the whole array
        fmt = f"<{count}{_SCALARS[item]}"
        values = list(struct.unpack_from(fmt, self.buf, self.pos))
        self.pos += struct.calcsize(fmt)
        return values
      return [self.value(item) for _ in range(count)]
    if kind not in _SCALARS:
      raise ValueError(f"unknown GGUF value type {kind}")
    return self.unpack(_SCALARS[kind])


def read_gguf(path: str) -> GGUFFile:
  """Parses `path`; a file that is not GGUF, or is cut short, raises ValueError."""
  raw = np.memmap(path, dtype=np.uint8, mode="r")
  cur = _Cursor(memoryview(raw))
  try:
    if bytes(cur.buf[:4]) != _MAGIC:
      raise ValueError("no GGUF magic at the start")
    cur.pos = 4
    version = cur.unpack("I")
    if version not in (2, 3):
      raise ValueError(f"GGUF version {version} (only 2 and 3 are read)")
    n_tensors, n_fields = cur.unpack("Q"), cur.unpack("Q")
    metadata = {}
    for _ in range(n_fields):
      key = cur.string()
      metadata[key] = cur.value(cur.unpack("I"))
    infos = []
    for _ in range(n_tensors):
      name = cur.string()
      dims = [cur.unpack("Q") for _ in range(cur.unpack("I"))]
      infos.append((name, GGMLQuantizationType(cur.unpack("I")), dims, cur.unpack("Q")))
  except struct.error as e:
    raise ValueError(f"the file ends inside its header ({e})") from e
  align = int(metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))
  start = -(-cur.pos // align) * align
  tensors = {}
  for name, kind, dims, offset in infos:
    block, size = GGML_QUANT_SIZES[kind]
    shape = tuple(reversed(dims))
    n_bytes = math.prod(dims) // block * size
    begin = start + offset
    if begin + n_bytes > raw.size:
      raise ValueError(f"tensor {name} runs past the end of the file")
    data = raw[begin:begin + n_bytes].reshape(*shape[:-1], shape[-1] // block * size)
    tensors[name] = GGUFTensor(kind, shape, data)
  return GGUFFile(metadata, tensors)
