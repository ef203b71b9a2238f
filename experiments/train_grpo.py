"""GRPO training (baseline or with speculative decoding); the last line is one JSON object.

  python -m experiments.train_grpo --config=experiments/configs/tiny_baseline.py
  python -m experiments.train_grpo --config=experiments/configs/tiny_tlt.py
Re-running the same command resumes from the run directory's latest checkpoint.
"""

import json

import numpy as np
from absl import app
from ml_collections import config_flags

from tlt_jax.rl.grpo import GRPOConfig
from tlt_jax.rl.trainer import Trainer
from tlt_jax.rl.update import OptimConfig
from tlt_jax.rollout.engine import EngineConfig
from tlt_jax.spec.strategy import spec_config_from_dict
from tlt_jax.workloads import build_drafter, build_workload

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/tiny_baseline.py")


def main(argv):
  del argv
  c = _CONFIG.value
  spec = spec_config_from_dict(c.spec) if c.spec else None
  drafter = None
  if spec is not None and any(a.proposer == "eagle" for a in spec.arms):
    drafter, _ = build_drafter(c)
  w = build_workload(c, c.num_prompts, c.seed)
  trainer = Trainer(w, out_dir=c.out_dir, steps=c.steps, prompts_per_step=c.prompts_per_step,
                    group_size=c.group_size, engine_cfg=EngineConfig.from_dict(c.engine),
                    grpo=GRPOConfig(**c.grpo), optim=OptimConfig(**c.optim), seed=c.seed,
                    spec=spec, drafter=drafter, checkpoint_every=c.checkpoint_every,
                    micro_batches=c.micro_batches)
  history = trainer.run()
  if not history:
    print(json.dumps({"name": c.name, "note": "already at the final step", "steps": c.steps}))
    return
  rewards = [m["reward"] for m in history]
  print(json.dumps({
      "name": c.name, "steps": len(history), "reward_first": rewards[0],
      "reward_last": rewards[-1], "reward_last5_mean": float(np.mean(rewards[-5:])),
      "step_s_mean": float(np.mean([m["step_s"] for m in history])),
      "rollout_share": float(np.mean([m["rollout_share"] for m in history])),
      "accept_len": float(np.mean([m["accept_len"] for m in history])),
      "out_dir": c.out_dir}))


if __name__ == "__main__":
  app.run(main)
