"""Two reward functions written as verl and TRL write theirs, to copy for your own (`task.reward=
experiments.example_rewards:verl_gsm8k` or `:trl_gsm8k`; docs/YOUR_MODEL.md): 1.0 when the
response's final number (after `####`, else its last number) equals the gold answer.

  python -m experiments.train_grpo --config=experiments/configs/hf_math.py \
    --config.model.path=DIR --config.task.dataset=train.parquet \
    --config.task.reward=experiments.example_rewards:verl_gsm8k
"""

import re

_NUMBER = re.compile(r"-?\d[\d,]*\.?\d*")


def _final_number(text: str) -> str | None:
  tail = text.rsplit("####", 1)[1] if "####" in text else text
  found = _NUMBER.findall(tail)
  return found[-1].replace(",", "").rstrip(".") if found else None


def verl_gsm8k(data_source, solution_str, ground_truth, extra_info=None) -> float:
  """verl's signature: the row's `data_source` (its column, else the dataset file's name), the
  response's text, the gold answer and the row's other columns."""
  del data_source, extra_info
  return 1.0 if _final_number(solution_str) == str(ground_truth).replace(",", "") else 0.0


def trl_gsm8k(prompts, completions, answer, **columns) -> list[float]:
  """TRL's batched signature: the prompts' and responses' texts and every dataset column as a
  list (the gold answer as `answer`), one entry per row."""
  del prompts, columns
  return [1.0 if _final_number(c) == str(a).replace(",", "") else 0.0
          for c, a in zip(completions, answer)]
