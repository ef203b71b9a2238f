"""Curves of any runs from their run directories: batch reward, held-out accuracy, response
length and (where a run speculated) accepted length by step, one PNG each, every run a line
labelled by its name, into the first run's `plots/` (or `--out_dir`).

  python -m experiments.plot runs/tiny_baseline
  python -m experiments.plot runs/tiny_baseline runs/tiny_tlt --out_dir=runs/plots
"""

import json

from absl import flags

from experiments import launch
from tlt_jax.errors import ConfigError
from tlt_jax.paths import as_path
from tlt_jax.rl.pictures import run_curves

_OUT = flags.DEFINE_string("out_dir", "", "Where the PNGs go (default: RUN/plots of the first).")


def main(argv):
  runs = argv[1:]
  if not runs:
    raise ConfigError("Give the run directories to plot: python -m experiments.plot RUN [RUN ...]")
  missing = [r for r in runs if not (as_path(r) / "metrics.jsonl").exists()]
  if missing:
    raise ConfigError(f"{missing[0]} holds no metrics.jsonl: give train_grpo run directories.")
  written = run_curves(runs, _OUT.value or str(as_path(runs[0]) / "plots"))
  print(json.dumps({"runs": runs, "plots": written}))


if __name__ == "__main__":
  launch.run(main)
