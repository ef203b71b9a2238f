"""Trains (or loads: shipped, then cached) the warm-started `tiny` policy and evaluates it.

  python -m experiments.sft_warmstart --config=experiments/configs/sft_tiny.py
Regenerate the warm start shipped with the package (`make warmstart`, ~4 min; not run by CI):
  python -m experiments.sft_warmstart --config=experiments/configs/sft_tiny.py --ship
"""

import json

from absl import flags
from ml_collections import config_flags

from experiments import launch
from tlt_jax import sft
from tlt_jax.evaluation import evaluate_task
from tlt_jax.hashing import provenance
from tlt_jax.tasks.arithmetic import TaskConfig

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/sft_tiny.py")
_SHIP = flags.DEFINE_bool("ship", False, f"Train from scratch and write the result to "
                          f"{sft.SHIPPED_DIR} (the warm start the package ships).")


def main(argv):
  del argv
  config = _CONFIG.value
  if _SHIP.value:
    summary = sft.ship(config)
    model, _ = sft.warm_start(config)
    print(f"warm start trained and shipped at {summary['cache']}")
  else:
    model, summary = sft.warm_start(config)
    print(f"warm start {provenance(summary)}: {summary['cache']}")
  ev = config.eval
  stats = evaluate_task(model, TaskConfig.from_dict(config.task), num_prompts=ev.num_prompts,
                        group_size=ev.group_size, temperature=ev.temperature, seed=ev.seed)
  print(json.dumps({**{k: v for k, v in summary.items() if k not in ("cached", "shipped")},
                    **stats}))


if __name__ == "__main__":
  launch.run(main)
