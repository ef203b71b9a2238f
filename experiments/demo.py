"""The demo: the cached warm start (trained first if missing), then a sampling run.

  python -m experiments.demo --config=experiments/configs/demo.py
The last line printed is one JSON object with the run's figures.
"""

import json
import time

from absl import app
from ml_collections import config_flags

from tlt_jax import sft
from tlt_jax.evaluation import evaluate_task
from tlt_jax.tasks.arithmetic import TaskConfig

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/demo.py")


def main(argv):
  del argv
  config = _CONFIG.value
  start = time.time()
  model, summary = sft.warm_start(config.sft)
  print(f"[demo] warm start {'loaded from' if summary['cached'] else 'trained and cached at'} "
        f"{summary['cache']}")
  ev = config.eval
  stats = evaluate_task(model, TaskConfig.from_dict(config.sft.task), num_prompts=ev.num_prompts,
                        group_size=ev.group_size, temperature=ev.temperature, seed=ev.seed)
  print(f"[demo] {ev.num_prompts} prompts x {ev.group_size} samples at temperature "
        f"{ev.temperature}: accuracy {stats['accuracy']:.3f}, response length p50 "
        f"{stats['length_p50']:.0f} / p99 {stats['length_p99']:.0f}, mixed-reward groups "
        f"{stats['mixed_group_fraction']:.2f}")
  print(json.dumps({"warm_start_accuracy": stats["accuracy"], **stats,
                    "wall_s": round(time.time() - start, 1)}))


if __name__ == "__main__":
  app.run(main)
