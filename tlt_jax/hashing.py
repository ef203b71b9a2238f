"""The one content hash behind every cache key (SFT warm starts, warm-up drafters, executables),
how a cached product was found, and the commit a record was made from."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def content_digest(obj, length: int = 12) -> str:
  """A short hex digest of `obj` as canonical JSON (sorted keys; other objects by `str`)."""
  text = json.dumps(obj, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:length]


def provenance(summary: dict) -> str:
  """Where a cached product came from, from its summary's `shipped` and `cached` flags."""
  if summary.get("shipped"):
    return "shipped with the package"
  return "loaded from the cache" if summary.get("cached") else "trained and cached"


def git_commit() -> tuple[str | None, bool | None]:
  """(commit, dirty) of the checkout the package runs from: the HEAD commit and whether tracked
  files differ from it; (None, None) outside a git checkout."""
  git = lambda *a: subprocess.run(["git", "-C", _ROOT, *a], capture_output=True, text=True,
                                  timeout=10)
  try:
    head = git("rev-parse", "HEAD")
    if head.returncode != 0:
      return None, None
    return head.stdout.strip(), bool(git("status", "--porcelain", "--untracked-files=no"
                                         ).stdout.strip())
  except (OSError, subprocess.SubprocessError):
    return None, None
