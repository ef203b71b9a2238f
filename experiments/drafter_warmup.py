"""Warms up (or loads from the cache) the EAGLE drafter of a workload's policy, then reports its
accepted length with a chain of 4 on held-out prompts, greedy and at the workload's temperature
(`coupled` rule: the rollout's own sampling, so this is the acceptance a rollout sees).

  python -m experiments.drafter_warmup --config=experiments/configs/drafter_tiny.py
  python -m experiments.drafter_warmup --config=experiments/configs/demo.py:drafter --ship
With --ship the drafter's weights are also written into the package (tlt_jax/assets/drafters),
where every later warm-up with the same key finds them.
"""

import dataclasses
import json

import jax
from absl import flags
from ml_collections import config_flags

from experiments import launch
from tlt_jax.drafter.proposer import EagleProposer
from tlt_jax.drafter.warmup import ship_drafter
from tlt_jax.hashing import provenance
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.spec.strategy import SpecConfig, Strategy
from tlt_jax.workloads import build_drafter, build_workload, drafter_recipe, workload_config

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/drafter_tiny.py")
_SHIP = flags.DEFINE_bool("ship", False, "Also write the drafter into the package's assets.")


def main(argv):
  del argv
  c = _CONFIG.value
  wc, recipe = workload_config(c), drafter_recipe(c.drafter, ("adaptive", "eval_prompts"))
  ecfg = EngineConfig.from_dict(c.rollout.engine)
  drafter, meta = build_drafter(wc, recipe, c.seed)
  w = build_workload(wc, c.drafter.eval_prompts, c.seed + 2, split="test")  # held-out prompts
  eval_prompts = w.prompts
  print(f"drafter {provenance(meta)}: {meta['cache']}")
  if _SHIP.value and not meta["shipped"]:
    print(f"drafter shipped at {ship_drafter(meta['cache'], meta['key'])}")
  accept = {}
  for name, params in (("greedy", dataclasses.replace(w.params, temperature=0.0)),
                       (f"t{w.params.temperature:g}", w.params)):
    spec = SpecConfig(threshold=10**6, arms=(Strategy("eagle", depth=4),), min_accept_len=0.0,
                      rule="coupled")
    engine = RolloutEngine(w.model, ecfg, pad_id=w.tokenizer.pad_id,
                           spec=spec, drafter=EagleProposer(drafter))
    engine.generate(eval_prompts, 1, params, jax.random.key(c.seed))
    accept[f"accept_len_{name}_heldout"] = round(engine.spec.accept_len(), 3)
  train = {k: meta[k] for k in sorted(meta) if k.startswith("top1_agreement")}
  print(json.dumps({"cache": meta["cache"], **{f"{k}_train": v for k, v in train.items()},
                    "loss": meta.get("loss"), "seconds": meta.get("seconds"), **accept}))


if __name__ == "__main__":
  launch.run(main)
