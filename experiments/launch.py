"""What every launcher shares: absl's `app.run`, with the libraries' INFO logs off and a
one-line error for a bad command line or a bad config setting (`ConfigError`).

A run prints its progress bars, its `[run]`/`[demo]` summary lines and warnings. orbax, jax and
absl log every checkpoint and compile at INFO; ask for them with `--verbosity=0` (absl's flag) or
`TLT_JAX_VERBOSITY=0` in the environment.
"""

import difflib
import importlib.util
import os
import sys

import ml_collections
from absl import app, flags
from absl.logging import converter

from tlt_jax.distributed import DistributedError
from tlt_jax.errors import ConfigError

_VERBOSITY_ENV = "TLT_JAX_VERBOSITY"


def run(main) -> None:
  """`app.run(main)` with warnings and errors only, unless the command line (`--verbosity`) or
  the environment asks for more. (`app.run` itself raises the level to INFO when the flag was not
  given, so the level is applied inside `main`.)"""
  value = os.environ.get(_VERBOSITY_ENV, str(converter.ABSL_WARNING))
  try:
    level = int(value)
  except ValueError:
    raise SystemExit(f"{_VERBOSITY_ENV}={value!r} is not an integer; use absl's levels "
                     "(-1 warnings, 0 info, 1 debug).") from None

  def quiet_main(argv):
    if not flags.FLAGS["verbosity"].present:
      flags.FLAGS.verbosity = level
    try:
      return main(argv)
    except (ConfigError, DistributedError) as e:  # a bad setting or start: one line
      raise SystemExit(str(e)) from None

  app.run(quiet_main, flags_parser=_parse_flags)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing; a config override of a key the config lacks, an unparsable value or a
  config file that fails to load ends the process with one line naming it, before any work."""
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError):  # ml_collections: an override of a key the config lacks
    raise SystemExit(_unknown_key(argv)) from None
  except flags.Error as e:
    lines = [line for line in str(e).splitlines() if line.strip()]
    raise SystemExit(f"{lines[0]} {lines[-1]}" if len(lines) > 1 else lines[0]) from None


def _unknown_key(argv: list[str]) -> str:
  """The message for the first `--config.a.b=v` whose path the config (loaded again) lacks."""
  spec = next(a.split("=", 1)[1] for a in argv if a.startswith("--config="))
  path, _, variant = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  config = module.get_config(variant) if variant else module.get_config()
  for arg in argv:
    if not arg.startswith("--config."):
      continue
    node, parts = config, arg[len("--config."):].split("=", 1)[0].split(".")
    for i, part in enumerate(parts):
      keys = list(node.keys()) if isinstance(node, (ml_collections.ConfigDict, dict)) else []
      if part not in keys:
        at = ".".join(["config", *parts[:i]])
        near = difflib.get_close_matches(part, keys, n=1)
        hint = f"did you mean {at}.{near[0]}? " if near else ""
        return (f"{arg}: {at} has no key {part!r}; {hint}its keys: {', '.join(sorted(keys))} "
                f"(see {path}).")
      node = node[part]
  return f"{' '.join(sys.argv[1:])}: a config override names a key the config does not have."
