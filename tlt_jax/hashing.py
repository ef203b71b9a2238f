"""The one content hash behind every cache key (SFT warm starts, warm-up drafters, executables)."""

from __future__ import annotations

import hashlib
import json


def content_digest(obj, length: int = 12) -> str:
  """A short hex digest of `obj` as canonical JSON (sorted keys; other objects by `str`)."""
  text = json.dumps(obj, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:length]
