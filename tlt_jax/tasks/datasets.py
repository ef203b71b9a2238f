"""Prompt/answer datasets from local files, in the formats people have on disk (split into a
training and a held-out side by `tasks/splits.py`).

Files: `.jsonl` (one object a line), `.json` (a list of objects) or `.parquet`. Row formats,
tried in this order unless `prompt_key`/`answer_key` name the columns:
  verl's RL parquet   `prompt` a list of chat messages, `reward_model.ground_truth`
  GSM8K               `question`, `answer` ending in `#### N` (the answer is N)
  MATH                `problem`, `solution` holding `\\boxed{...}` (the answer is its content)
  prompt/answer       `prompt`, `answer`
A row that cannot be read is a one-line error naming the file and the row (1-based).
"""

from __future__ import annotations

import dataclasses
import json
import os

import pyarrow.parquet as pq

from tlt_jax.errors import ConfigError
from tlt_jax.tasks.math_answers import boxed_content


@dataclasses.dataclass(frozen=True)
class Example:
  """One row: the prompt (text, or chat messages to render with the tokenizer's template), the
  gold answer as written, and what a reward may read besides (`tasks/rewards.py`): the file it
  came from (`source`) and the row's columns as they are."""

  prompt: str | tuple
  answer: str
  source: str = ""
  columns: dict = dataclasses.field(default_factory=dict, compare=False)

  @property
  def text(self) -> str:
    """The prompt's text (the messages' contents joined): what the held-out split hashes."""
    if isinstance(self.prompt, str):
      return self.prompt
    return "\n".join(str(m.get("content", "")) for m in self.prompt)


def read_rows(path: str) -> list[dict]:
  """The rows of a `.jsonl`, `.json` or `.parquet` file."""
  if not os.path.exists(path):
    raise ConfigError(f"Dataset file {path} does not exist (datasets load from local paths).")
  if path.endswith(".parquet"):
    return pq.read_table(path).to_pylist()
  if path.endswith(".json"):
    with open(path) as f:
      try:
        rows = json.load(f)
      except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e.msg}, line {e.lineno}).") from None
    if not isinstance(rows, list):
      raise ConfigError(f"{path}: a .json dataset must hold a list of rows.")
    return rows
  if not path.endswith(".jsonl"):
    raise ConfigError(f"{path}: datasets are .jsonl, .json or .parquet files.")
  rows = []
  with open(path) as f:
    for n, line in enumerate(f, 1):
      if line.strip():
        try:
          rows.append(json.loads(line))
        except json.JSONDecodeError as e:
          raise ConfigError(f"{path}, row {n}: not valid JSON ({e.msg}).") from None
  return rows


def example(row, path: str, n: int, prompt_key: str = "", answer_key: str = "") -> Example:
  """Row `n` of `path` as an `Example`; a one-line error where it fits no format."""
  where = f"{path}, row {n}"
  if not isinstance(row, dict):
    raise ConfigError(f"{where}: a row must be an object, got {type(row).__name__}.")
  if prompt_key or answer_key:
    missing = [k for k in (prompt_key, answer_key) if k and k not in row]
    if missing:
      raise ConfigError(f"{where}: no column {missing[0]!r} (task.prompt_key / task.answer_key); "
                        f"its columns: {', '.join(sorted(row))}.")
    return Example(_prompt(row[prompt_key or "prompt"], where),
                   str(row[answer_key or "answer"]).strip())
  if isinstance(row.get("prompt"), (list, tuple)) and isinstance(row.get("reward_model"), dict):
    return Example(_prompt(row["prompt"], where),
                   str(row["reward_model"].get("ground_truth")).strip())
  if "question" in row and "answer" in row:
    if "####" not in str(row["answer"]):
      raise ConfigError(f"{where}: a GSM8K answer must end with '#### N'.")
    return Example(str(row["question"]), str(row["answer"]).rsplit("####", 1)[1].strip())
  if "problem" in row and "solution" in row:
    answer = boxed_content(str(row["solution"]))
    if answer is None:
      raise ConfigError(f"{where}: a MATH solution must hold \\boxed{{...}}.")
    return Example(str(row["problem"]), answer)
  if "prompt" in row and "answer" in row:
    return Example(_prompt(row["prompt"], where), str(row["answer"]).strip())
  raise ConfigError(f"{where}: columns {', '.join(sorted(row))} fit no known format (GSM8K "
                    "question/answer, MATH problem/solution, verl prompt/reward_model, "
                    "prompt/answer); name them with task.prompt_key and task.answer_key.")


def _prompt(value, where: str) -> str | tuple:
  if isinstance(value, str):
    return value
  if isinstance(value, (list, tuple)) and all(isinstance(m, dict) and "content" in m
                                              for m in value):
    return tuple({"role": str(m.get("role", "user")), "content": str(m["content"])}
                 for m in value)
  raise ConfigError(f"{where}: a prompt must be text or a list of chat messages "
                    "({'role': ..., 'content': ...}).")


def load_examples(path: str, prompt_key: str = "", answer_key: str = "") -> list[Example]:
  """Every row of a dataset file as an `Example` (with its file's name and its columns)."""
  source = os.path.basename(path)
  out = [dataclasses.replace(example(r, path, n, prompt_key, answer_key), source=source,
                             columns=r) for n, r in enumerate(read_rows(path), 1)]
  if not out:
    raise ConfigError(f"{path} holds no rows.")
  return out

