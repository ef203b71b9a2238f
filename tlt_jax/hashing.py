"""The one content hash behind every cache key (SFT warm starts, warm-up drafters, executables),
and how a cached product was found."""

from __future__ import annotations

import hashlib
import json


def content_digest(obj, length: int = 12) -> str:
  """A short hex digest of `obj` as canonical JSON (sorted keys; other objects by `str`)."""
  text = json.dumps(obj, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:length]


def provenance(summary: dict) -> str:
  """Where a cached product came from, from its summary's `shipped` and `cached` flags."""
  if summary.get("shipped"):
    return "shipped with the package"
  return "loaded from the cache" if summary.get("cached") else "trained and cached"
