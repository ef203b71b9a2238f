"""Samples a real model's answers to math word problems and reports reward and lengths.

  python -m experiments.eval_math --config=experiments/configs/eval_smollm2_word_problems.py
"""

import json
import time

from ml_collections import config_flags

from experiments import launch
from tlt_jax.evaluation import evaluate_math
from tlt_jax.models.pretrained import load_setting
from tlt_jax.tasks.math_data import load_math_dataset
from tlt_jax.tasks.word_problems import WordProblemConfig, make_word_problems

_CONFIG = config_flags.DEFINE_config_file("config")


def main(argv):
  del argv
  c = _CONFIG.value
  if c.dataset:
    problems = load_math_dataset(c.dataset)[: c.num_prompts]
  else:
    problems = make_word_problems(c.num_prompts, WordProblemConfig(**c.word_problems), c.seed,
                                  "test")
  start = time.time()
  model, tok = load_setting("config.model", c.model)
  load_s = time.time() - start
  stats = evaluate_math(model, tok, problems, group_size=c.group_size, temperature=c.temperature,
                        max_new_tokens=c.max_new_tokens, seed=c.seed, rows_per_call=c.rows_per_call,
                        instruction=c.instruction)
  print(json.dumps({"model": c.model, "load_s": round(load_s, 2), "reward": stats["accuracy"],
                    **stats, "eval_s": round(time.time() - start - load_s, 1)}))


if __name__ == "__main__":
  launch.run(main)
