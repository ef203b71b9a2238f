"""Runs every point of a sweep grid, one run directory each; the last line is one JSON object
listing the points and their final figures. The grid comes from the command line (`--grid`, a
JSON object of dotted config fields to lists of values) or from the config's `sweep` field.

  python -m experiments.sweep --config=experiments/configs/tiny_seeds.py
  python -m experiments.sweep --config=experiments/configs/tiny_baseline.py \
      --grid='{"rl.optim.lr": [1e-4, 3e-4], "seed": [0, 1]}'
Re-running the same command resumes: finished points are skipped, a killed one resumes from its
latest checkpoint. Points run one after the other, each in its own process; other `--config.*`
overrides apply to every point. A field no config section has is one line before any point runs.
"""

import json
import os
import subprocess
import sys

from absl import flags
from ml_collections import config_flags

from experiments import launch
from tlt_jax.errors import ConfigError
from tlt_jax.rl.compare import read_metrics
from tlt_jax.sweep import as_grid, grid_points, point_args, point_name

_CONFIG = config_flags.DEFINE_config_file("config", None, "A launcher config (its `sweep` grid "
                                          "unless --grid gives one).")
_GRID = flags.DEFINE_string("grid", "", "The grid as JSON: {\"dotted.field\": [values...]}.")
_MODULE = flags.DEFINE_string("module", "experiments.train_grpo", "The launcher each point runs.")


def main(argv):
  del argv
  c = _CONFIG.value
  try:
    points = grid_points(as_grid(_GRID.value or c.get("sweep") or {}))
  except ValueError as e:
    raise ConfigError(str(e)) from None
  config_arg = next(a for a in sys.argv if a.startswith("--config="))
  for field in points[0]:  # each a key the launcher takes: one line before any point runs
    problem = launch.key_problem(c, f"--config.{field}=", config_arg.split("=", 1)[1])
    if problem:
      raise ConfigError(f"the sweep's {problem}")
  overrides = [a for a in sys.argv[1:] if a.startswith("--config.")]  # apply to every point
  results = []
  for i, point in enumerate(points):
    run_dir = os.path.join(c.out_dir, point_name(point))
    print(f"[sweep] point {i + 1}/{len(points)}: {point} -> {run_dir}", flush=True)
    args = point_args(config_arg, point, c.out_dir)
    proc = subprocess.run([sys.executable, "-m", _MODULE.value, args[0], *overrides, *args[1:]])
    if proc.returncode != 0:
      raise SystemExit(f"[sweep] point {point} failed (exit {proc.returncode}); fix it and re-run "
                       "the same command to resume the sweep.")
    last = read_metrics(run_dir)[-1]
    results.append({"point": point, "run_dir": run_dir, "steps": last["step"] + 1,
                    "reward_last": last["reward"]})
  print(json.dumps({"sweep": c.name, "points": results}))


if __name__ == "__main__":
  launch.run(main)
