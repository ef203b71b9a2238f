"""What every launcher shares: absl's `app.run`, with the libraries' INFO logs off and a
one-line error for a bad command line (absl's `UsageError`, a missing config file) or a bad config
setting (`ConfigError`).

Every launcher points JAX's persistent compilation cache, once, before anything compiles: at the
config's `rollout.engine.compile_cache_dir`, else the one the environment names, else
`<cache_dir>/jax` (`rollout/pool.use_compilation_cache`), so a second run loads its programs.

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
from tlt_jax.errors import ConfigError, first_line
from tlt_jax.rl import schema
from tlt_jax.rollout.pool import use_compilation_cache
from tlt_jax.sft import default_cache_dir

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
      _use_compilation_cache(flags.FLAGS["config"].value if "config" in flags.FLAGS else None)
      return main(argv)
    except (ConfigError, DistributedError, app.UsageError) as e:  # a bad setting, start or
      raise SystemExit(str(e)) from None                           # command line: one line

  app.run(quiet_main, flags_parser=parse_flags)


def _use_compilation_cache(config) -> str:
  """JAX's compilation cache for this process, from the launcher's config where it has one."""
  config = config if isinstance(config, ml_collections.ConfigDict) else ml_collections.ConfigDict()
  engine = (config.get("rollout") or {}).get("engine") or {}
  return use_compilation_cache(engine.get("compile_cache_dir", ""),
                               os.path.join(config.get("cache_dir") or default_cache_dir(), "jax"))


def parse_flags(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> list[str]:
  """absl's flag parsing into `flag_values`, plus overrides of run-config fields the config file
  does not mention (`tlt_jax.rl.schema`: any field of the section's dataclass). A key neither the
  config nor the schema has, an unparsable value or a config file that fails to load ends the
  process with one line naming it, before any work."""
  added = []
  # Only this launcher's own flags: what follows `--` is another command's (`launch_local`).
  own = argv[:argv.index("--")] if "--" in argv else argv
  spec = next((a.split("=", 1)[1] for a in own if a.startswith("--config=")), "")
  if "config" in flag_values and spec and not os.path.isfile(spec.partition(":")[0]):
    raise SystemExit(f"--config={spec}: no config file {spec.partition(':')[0]!r}; the recipes "
                     "are in experiments/configs/.")
  if "config" in flag_values and any(a.startswith("--config.") for a in own):
    try:
      config, path = _load_config(own, flag_values)
    except Exception as e:  # absl's own words for a config file that fails to load
      raise SystemExit(f"flag --config={spec}: Error whilst parsing config file: "
                       f"{first_line(e)}") from None
    for arg in [a for a in own if a.startswith("--config.")]:
      if has_path(config, override_path(arg)):
        continue
      error = unknown_key(config, arg, path)
      if error:
        raise SystemExit(error)
      added.append(arg)
  # ml_collections reads its overrides from sys.argv itself: the added ones must leave it too.
  sys.argv[:] = [a for i, a in enumerate(sys.argv) if a not in added or "--" in sys.argv[:i]]
  try:
    rest = flag_values([a for i, a in enumerate(argv) if a not in added or "--" in argv[:i]])
  except flags.Error as e:
    lines = [line for line in str(e).splitlines() if line.strip()]
    raise SystemExit(f"{lines[0]} {lines[-1]}" if len(lines) > 1 else lines[0]) from None
  for arg in added:
    set_field(flag_values["config"].value, arg)
  return rest


def override_path(arg: str) -> tuple[str, ...]:
  """The key path an override sets (`--config.a.b=v` -> ("a", "b"))."""
  return tuple(arg[len("--config."):].split("=", 1)[0].split("."))


def _load_config(argv: list[str], flag_values: flags.FlagValues):
  """The config file the command line names (`--config=path[:variant]`), loaded, and its path."""
  spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  if spec is None:
    spec = flag_values["config"].default_as_str.strip("'")
  path, _, variant = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return (module.get_config(variant) if variant else module.get_config()), path


def has_path(config, parts) -> bool:
  """Whether the config file holds the key at `parts`."""
  node = config
  for part in parts:
    if not isinstance(node, (ml_collections.ConfigDict, dict)) or part not in node:
      return False
    node = node[part]
  return True


def unknown_key(config, arg: str, path: str) -> str:
  """'' when `arg` sets a field the schema has in a section the config holds; else the one-line
  message naming the nearest known key."""
  parts, run = override_path(arg), _is_run_config(config)
  if run and schema.field_type(parts, config) is not None:
    return ""
  node = config
  for i, part in enumerate(parts):
    keys = set(node.keys()) if isinstance(node, (ml_collections.ConfigDict, dict)) else set()
    if run:  # the schema's fields and sections there
      keys |= set(schema.fields(parts[:i], config)) | {p[i] for p in schema.SECTIONS
                                                if len(p) > i and p[:i] == parts[:i]}
    if part not in keys or i == len(parts) - 1:
      at = ".".join(["config", *parts[:i]])
      near = difflib.get_close_matches(part, sorted(keys), n=1)
      hint = f"did you mean {at}.{near[0]}? " if near else ""
      return (f"{arg}: {at} has no key {part!r}; {hint}its keys: {', '.join(sorted(keys))} "
              f"(see {path} and tlt_jax/rl/schema.py).")
    node = node[part] if part in node else {}
  return ""


def key_problem(config, arg: str, path: str) -> str:
  """'' when `arg` (`--config.a.b=v`) sets a key the config file holds or its schema allows;
  else the one-line message naming the nearest known key."""
  return "" if has_path(config, override_path(arg)) else unknown_key(config, arg, path)


def _is_run_config(config) -> bool:
  """Whether `config` holds a run's sections (`tlt_jax/rl/config.py`; a benchmark's take the
  workload's), whose schema applies."""
  return all(k in config and hasattr(config[k], "keys") for k in ("model", "rollout"))


def set_field(config, arg: str) -> None:
  """Applies `--config.a.b=v` for a schema field the config file does not hold (sections made
  as needed), the value parsed by the field's type."""
  parts, text = override_path(arg), arg.split("=", 1)[1] if "=" in arg else ""
  try:
    value = schema.parse_value(text, schema.field_type(parts, config))
  except ValueError as e:
    raise SystemExit(f"{arg}: {e}.") from None
  node = config
  with config.unlocked():
    for part in parts[:-1]:
      if part not in node or node[part] is None:
        node[part] = ml_collections.ConfigDict()
      node = node[part]
    node[parts[-1]] = value
