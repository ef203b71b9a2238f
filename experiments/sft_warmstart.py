"""Trains (or loads from the cache) the warm-started `tiny` policy and evaluates it.

  python -m experiments.sft_warmstart --config=experiments/configs/sft_tiny.py
"""

import json

from absl import app
from ml_collections import config_flags

from tlt_jax import sft
from tlt_jax.evaluation import evaluate_task
from tlt_jax.tasks.arithmetic import TaskConfig

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/sft_tiny.py")


def main(argv):
  del argv
  config = _CONFIG.value
  model, summary = sft.warm_start(config)
  print(f"warm start {'loaded from' if summary['cached'] else 'trained and cached at'} "
        f"{summary['cache']}")
  ev = config.eval
  stats = evaluate_task(model, TaskConfig.from_dict(config.task), num_prompts=ev.num_prompts,
                        group_size=ev.group_size, temperature=ev.temperature, seed=ev.seed)
  print(json.dumps({**{k: v for k, v in summary.items() if k != "cached"}, **stats}))


if __name__ == "__main__":
  app.run(main)
