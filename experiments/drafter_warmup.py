"""Warms up (or loads from the cache) the EAGLE drafter of a workload's policy, then reports its
accepted length with a chain of `--depth` on held-out prompts, greedy and at the workload's
temperature under both rules (`coupled`: the rollout's own sampling; `rejection`).

  python -m experiments.drafter_warmup --config=experiments/configs/drafter_tiny.py
  python -m experiments.drafter_warmup --config=experiments/configs/demo.py:drafter --ship=demo
With --ship=NAME the drafter's weights are also written into the package
(tlt_jax/assets/drafters/NAME, with its key and this command), where every later warm-up with the
same key finds them and `--drafter=NAME` names them. Beside the acceptance it reports the training
metrics teacher-forced on new rollouts of those prompts (`tf_*`: a validation set), and
`--eval_side=train` measures both on the warm-up's own prompts instead (new samples), and the
teacher-forced metrics on the very sequences it trained on (`tf_*_trained`: against the held-out
ones, what more rollouts could gain).
"""

import dataclasses
import json
import sys

import jax
from absl import flags
from ml_collections import config_flags

from experiments import launch
from tlt_jax.drafter.proposer import EagleProposer
from tlt_jax.drafter.warmup import ship_drafter, teacher_forced_metrics, warmup_data
from tlt_jax.hashing import provenance
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.sft import default_cache_dir
from tlt_jax.spec.strategy import SpecConfig, Strategy
from tlt_jax.workloads import (build_drafter, build_workload, drafter_recipe, drafter_workload,
                               starting_policy, workload_config)

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/drafter_tiny.py")
_SHIP = flags.DEFINE_string("ship", "", "Also write the drafter into the package's assets under "
                            "this name.")
_DEPTH = flags.DEFINE_integer("depth", 4, "Chain length of the held-out acceptance.")
_EVAL_SIDE = flags.DEFINE_enum("eval_side", "test", ["test", "train"],
                               "Prompts of the acceptance: held out (test), or the first of the "
                               "warm-up's own (train; new samples), to tell memorised prompts "
                               "from a drafter that generalises.")


def main(argv):
  del argv
  c = _CONFIG.value
  wc, recipe = workload_config(c), drafter_recipe(c.drafter, ("adaptive", "eval_prompts"))
  ecfg = EngineConfig.from_dict(c.rollout.engine)
  policy = starting_policy(wc)  # loaded once, for the warm-up and the evaluation
  drafter, meta = build_drafter(wc, recipe, c.seed, policy=policy)
  if _EVAL_SIDE.value == "test":  # held-out prompts
    w = build_workload(wc, c.drafter.eval_prompts, c.seed + 2, policy=policy, split="test")
  else:
    w = drafter_workload(wc, recipe, c.seed, policy)
  eval_prompts = w.prompts[: c.drafter.eval_prompts]
  print(f"drafter {provenance(meta)}: {meta['cache']}")
  if _SHIP.value and not meta["shipped"]:
    command = " ".join(["python -m experiments.drafter_warmup", *sys.argv[1:]])
    print(f"drafter shipped at {ship_drafter(meta['cache'], _SHIP.value, meta['key'], command)}")
  accept = {}
  side = "heldout" if _EVAL_SIDE.value == "test" else "train_prompts"
  t = f"t{w.params.temperature:g}"
  for name, params, rule in (("greedy", dataclasses.replace(w.params, temperature=0.0), "coupled"),
                             (t, w.params, "coupled"), (f"{t}_rejection", w.params, "rejection")):
    spec = SpecConfig(threshold=10**6, arms=(Strategy("eagle", depth=_DEPTH.value),),
                      min_accept_len=0.0, rule=rule)
    engine = RolloutEngine(w.model, ecfg, pad_id=w.tokenizer.pad_id,
                           spec=spec, drafter=EagleProposer(drafter))
    engine.generate(eval_prompts, 1, params, jax.random.key(c.seed))
    accept[f"accept_len_{name}_{side}"] = round(engine.spec.accept_len(), 3)
  # Teacher-forced on new rollouts of the same prompts (`recipe.warmup.group_size` each, another
  # seed than the warm-up's): the training metrics, held out.
  cache_root, rows = wc.cache_dir or default_cache_dir(), recipe.warmup.batch_rows
  data = warmup_data(w.model, eval_prompts, w.params, recipe.warmup, w.tokenizer.pad_id,
                     cache_root, seed=recipe.warmup.seed + 1)
  tf = {f"tf_{k}_{side}": v
        for k, v in teacher_forced_metrics(drafter, w.model, data, rows).items()}
  if _EVAL_SIDE.value == "train":  # and on the very sequences it trained on (cached)
    trained = warmup_data(w.model, w.prompts, w.params, recipe.warmup, w.tokenizer.pad_id,
                          cache_root)
    tf.update({f"tf_{k}_trained": v
               for k, v in teacher_forced_metrics(drafter, w.model, trained, rows).items()})
  train = {k: meta[k] for k in sorted(meta) if k.startswith(("top1_agreement", "total_variation"))}
  print(json.dumps({"cache": meta["cache"], **{f"{k}_train": v for k, v in train.items()},
                    "loss": meta.get("loss"), "seconds": meta.get("seconds"), **accept, **tf}))


if __name__ == "__main__":
  launch.run(main)
