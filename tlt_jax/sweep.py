"""Sweeps: a config's `sweep` field declares a small grid (dotted config field -> values); every
grid point is one run in its own directory under the config's `out_dir`."""

from __future__ import annotations

import itertools
import os
import re


def grid_points(grid: dict) -> list[dict]:
  """The Cartesian product of `{field: values}` as a list of `{field: value}`, in declared order."""
  if not grid:
    raise ValueError("The config declares no sweep: set `sweep` to {dotted.field: (values...)}.")
  fields = list(grid)
  for f in fields:
    if not isinstance(grid[f], (list, tuple)) or not grid[f]:
      raise ValueError(f"Sweep field {f!r} must map to a non-empty tuple of values, got "
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
