"""GRPO training (baseline or with speculative decoding); the last line is one JSON object.

  python -m experiments.train_grpo --config=experiments/configs/tiny_baseline.py
  python -m experiments.train_grpo --config=experiments/configs/tiny_tlt.py
  python -m experiments.train_grpo --config=experiments/configs/smollm2_tlt.py
Re-running the same command resumes from the run directory's latest checkpoint (also after the
process was killed); compare two runs with `python -m experiments.compare_runs A B`.
"""

import json

from ml_collections import config_flags

from experiments import launch
from tlt_jax.rl.config import run_config
from tlt_jax.rl.run import run

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/tiny_baseline.py")


def main(argv):
  del argv
  rc = run_config(_CONFIG.value, other_keys=("sweep",))  # every setting checked first
  print(json.dumps(run(rc)))


if __name__ == "__main__":
  launch.run(main)
