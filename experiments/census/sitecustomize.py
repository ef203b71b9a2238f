"""A compile census of every Python process started with this folder on `PYTHONPATH` and
`COMPILE_CENSUS_DIR` set (`experiments/compile_census.py` says how to run and read it).

When JAX's compiler module is first imported, this hooks it: each backend compile (its program
name and seconds) and each persistent-cache miss or hit (with the cache key) is appended as one
JSON line to `COMPILE_CENSUS_DIR/<pid>.jsonl`, tagged with the pytest test running
(`PYTEST_CURRENT_TEST`, inherited by a test's subprocesses) or else the command line. It wraps
two private functions of `jax._src.compiler` (`log_persistent_cache_miss` and `_hit`): a JAX
release that renames them leaves the census without cache events, not broken.
"""

import importlib.abc
import importlib.util
import json
import os
import sys
import time

_DIR = os.environ.get("COMPILE_CENSUS_DIR")
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def _log(record: dict) -> None:
  record.update(pid=os.getpid(), t=time.time(),
                test=os.environ.get("PYTEST_CURRENT_TEST", "") or " ".join(sys.argv[:3]))
  with open(os.path.join(_DIR, f"{os.getpid()}.jsonl"), "a") as f:
    f.write(json.dumps(record) + "\n")


def _hook(compiler) -> None:
  """Wraps the compiler's cache logging and listens for backend compiles."""
  from jax._src import monitoring  # jax is importing: this module is loaded by now

  for name, event in (("log_persistent_cache_miss", "miss"), ("log_persistent_cache_hit", "hit")):
    original = getattr(compiler, name, None)
    if original is not None:
      def wrapped(module_name, cache_key, _original=original, _event=event):
        _log(dict(ev=_event, name=module_name, key=cache_key))
        return _original(module_name, cache_key)
      setattr(compiler, name, wrapped)

  def listener(event, duration, **kwargs):
    if event == _COMPILE_EVENT:
      _log(dict(ev="compile", name=kwargs.get("fun_name"), dur=duration))
  monitoring.register_event_duration_secs_listener(listener)


class _Finder(importlib.abc.MetaPathFinder):
  """Finds `jax._src.compiler` once, as the import system would, and hooks it once executed."""

  def find_spec(self, name, path, target=None):
    if name != "jax._src.compiler":
      return None
    sys.meta_path.remove(self)
    spec = importlib.util.find_spec(name)
    execute = spec.loader.exec_module

    def exec_module(module):
      execute(module)
      _hook(module)
    spec.loader.exec_module = exec_module
    return spec


if _DIR:
  os.makedirs(_DIR, exist_ok=True)
  sys.meta_path.insert(0, _Finder())
