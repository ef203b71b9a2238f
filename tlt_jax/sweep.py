"""Sweeps: a grid of dotted config fields -> values, from the command line (`--grid`, JSON) or a
config's `sweep` field; every grid point is one run in its own directory under the config's
`out_dir`."""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Mapping


def as_grid(value) -> dict:
  """A grid in any of its written forms as `{dotted.field: values}`: a JSON object (the command
  line's `--grid`), a mapping with dotted keys or nested sections (a config's `sweep`), or
  (field, values) pairs."""
  if isinstance(value, str):
    try:
      value = json.loads(value)
    except json.JSONDecodeError as e:
      raise ValueError(f"--grid is not a JSON object ({e.msg}); e.g. "
                       "--grid='{\"rl.optim.lr\": [1e-6, 3e-6]}'.") from None
  if isinstance(value, (list, tuple)):
    try:
      return {str(k): v for k, v in value}
    except (TypeError, ValueError):
      raise ValueError(f"A grid of pairs must be (field, values) pairs, got {value!r}.") from None
  if not isinstance(value, Mapping) and not hasattr(value, "items"):
    raise ValueError(f"A grid is a mapping of dotted fields to values, got {value!r}.")
  out = {}
  for k, v in value.items():
    if isinstance(v, Mapping) or hasattr(v, "keys"):  # a nested section
      out.update({f"{k}.{kk}": vv for kk, vv in as_grid(v).items()})
    else:
      out[str(k)] = v
  return out


def grid_points(grid: dict) -> list[dict]:
  """The Cartesian product of `{field: values}` as a list of `{field: value}`, in declared order."""
  if not grid:
    raise ValueError("No sweep grid: give --grid='{\"field\": [values...]}' or set the "
                     "config's `sweep` to {dotted.field: (values...)}.")
  fields = list(grid)
  for f in fields:
    if not isinstance(grid[f], (list, tuple)) or not grid[f]:
      raise ValueError(f"Sweep field {f!r} must map to a non-empty list of values, got "
                       f"{grid[f]!r}.")
  return [dict(zip(fields, vals)) for vals in itertools.product(*(grid[f] for f in fields))]


def point_name(point: dict) -> str:
  """A directory name for a grid point, e.g. `rl.optim.lr=0.0002,seed=1`."""
  name = ",".join(f"{k}={v}" for k, v in point.items())
  return re.sub(r"[^A-Za-z0-9_.,=+-]", "_", name)


def point_args(config_arg: str, point: dict, out_root: str) -> list[str]:
  """Command-line arguments of the launcher run for one grid point."""
  args = [config_arg, f"--config.out_dir={os.path.join(out_root, point_name(point))}"]
  for k, v in point.items():
    args.append(f"--config.{k}={v}")
  return args
