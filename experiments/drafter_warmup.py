"""Warms up (or loads from the cache) the EAGLE drafter of a workload's policy, then reports its
accepted length with greedy speculative decoding on held-out prompts.

  python -m experiments.drafter_warmup --config=experiments/configs/drafter_tiny.py
"""

import dataclasses
import json

import jax
from absl import app
from ml_collections import config_flags

from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.spec.strategy import SpecConfig, Strategy
from tlt_jax.workloads import build_drafter, build_workload

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/drafter_tiny.py")


def main(argv):
  del argv
  c = _CONFIG.value
  drafter, meta = build_drafter(c)
  w = build_workload(c, c.eval_prompts, c.seed + 2)  # held-out prompts
  eval_prompts = w.prompts
  print(f"drafter {'loaded from' if meta['cached'] else 'trained and cached at'} {meta['cache']}")
  greedy = dataclasses.replace(w.params, temperature=0.0)
  spec = SpecConfig(threshold=10**6, arms=(Strategy("eagle", depth=4),), min_accept_len=0.0)
  engine = RolloutEngine(w.model, EngineConfig.from_dict(c.engine), pad_id=w.tokenizer.pad_id,
                         spec=spec, drafter=drafter)
  engine.generate(eval_prompts, 1, greedy, jax.random.key(c.seed))
  print(json.dumps({"cache": meta["cache"], "top1_agreement_train": meta.get("top1_agreement"),
                    "loss": meta.get("loss"), "seconds": meta.get("seconds"),
                    "accept_len_greedy_heldout": round(engine.spec.accept_len(), 3)}))


if __name__ == "__main__":
  app.run(main)
