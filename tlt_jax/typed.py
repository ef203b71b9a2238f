"""A config section (a mapping from an ml-collections config) turned into its typed dataclass,
once, before any work: an unknown key names the nearest known one, a bad value names its key."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping

from tlt_jax.errors import ConfigError


def unknown_key_error(key: str, name: str, known) -> ConfigError:
  """The error for `config.<key>.<name>` when `<key>` knows only `known`."""
  at = f"config.{key}" if key else "config"
  near = difflib.get_close_matches(name, list(known), n=1)
  hint = f"did you mean {at}.{near[0]}? " if near else ""
  return ConfigError(f"{at} has no key {name!r}; {hint}its keys: {', '.join(sorted(known))}.")


def check_keys(section: Mapping, key: str, known) -> dict:
  """`section` as a dict, after checking that it holds only `known` keys."""
  d = dict(section or {})
  for name in d:
    if name not in known:
      raise unknown_key_error(key, name, known)
  return d


def typed(cls, section: Mapping | None, key: str, **parts: Callable):
  """`cls(**section)` for the dataclass `cls`, whose config key is `config.<key>`. Lists become
  tuples; `parts` maps a field to the function that builds it from its own section (a nested
  dataclass: `lambda d: typed(Inner, d, f"{key}.field")`)."""
  d = check_keys(section, key, [f.name for f in dataclasses.fields(cls)])
  for name, value in d.items():
    if name in parts:
      d[name] = parts[name](value)
    elif isinstance(value, list):
      d[name] = tuple(value)
  try:
    return cls(**d)
  except (TypeError, ValueError) as e:
    if isinstance(e, ConfigError):
      raise
    raise ConfigError(f"config.{key}: {e}") from None
