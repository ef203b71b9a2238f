"""A run's memory per device, planned from abstract shapes (`tlt_jax/rl/memory.py`): no weights,
no dataset and no device of the recipe's kind are needed. Prints the plan as a table and, last,
one JSON object with the per-device figures in GB and `fits`.

  python -m experiments.plan_memory --config=experiments/configs/hf_math.py:qwen2p5_1p5b_8xh100
  python -m experiments.plan_memory --config=experiments/configs/hf_math.py:qwen2p5_7b_64xh100
"""

import json

from ml_collections import config_flags

from experiments import launch
from tlt_jax.rl.config import run_config
from tlt_jax.rl.run import plan_for, planned_shape

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/hf_math.py")


def main(argv):
  del argv
  rc = run_config(_CONFIG.value, other_keys=("sweep",))
  cfg, source = planned_shape(rc)
  plan = plan_for(rc, cfg, rc.plan)
  target = rc.plan
  print(f"{rc.name}: the model of {source} on {target.processes} process(es) x "
        f"{target.devices} device(s) of {target.device_gb:g} GB; computed from shapes, not "
        "measured\n")
  print(plan.table())
  print(json.dumps(dict(plan.summary(), name=rc.name, shape=source,
                        processes=target.processes, devices=target.devices)))


if __name__ == "__main__":
  launch.run(main)
