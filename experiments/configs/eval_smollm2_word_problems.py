"""SmolLM2-135M-Instruct on the procedural word problems: reward and response lengths.

Run:
  python -m experiments.eval_math --config=experiments/configs/eval_smollm2_word_problems.py
Small CPU variant (tests):
  python -m experiments.eval_math --config=experiments/configs/eval_smollm2_word_problems.py:small
"""

import ml_collections


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.model = "smollm2"
  c.dataset = ""  # empty: procedural word problems; else a local GSM8K/prompt-answer file
  c.word_problems = ml_collections.ConfigDict(dict(min_steps=1, max_steps=2, max_value=20))
  # A 135M model given GSM8K's '####' instruction rambles past any length limit; asked to be
  # brief it states its answer (which the verifier reads) and still sometimes runs long.
  c.instruction = "Answer briefly."
  c.num_prompts = 64
  c.group_size = 4
  c.temperature = 0.9
  c.max_new_tokens = 192
  c.rows_per_call = 32
  c.seed = 0
  if variant == "small":
    c.num_prompts, c.group_size, c.max_new_tokens = 2, 2, 16
  elif variant:
    raise ValueError(f"Unknown variant {variant!r}; use '' or 'small'.")
  return c
