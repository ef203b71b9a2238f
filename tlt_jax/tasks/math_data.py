"""Math word-problem datasets from local files, and chat-template prompt formatting.

Formats: GSM8K (`question`, `answer` ending in `#### N`) as JSONL or parquet, and generic
`{"prompt": ..., "answer": ...}` JSONL. Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import json
import os

INSTRUCTION = "Solve the problem step by step. End with the final answer after '####'."


@dataclasses.dataclass(frozen=True)
class MathProblem:
  """A question and its gold final answer, from a GSM8K-format or prompt/answer dataset."""

  question: str
  answer: str  # the gold final answer, as written (e.g. "1,234" or "3/4")


def _records(path: str) -> list[dict]:
  if not os.path.exists(path):
    raise FileNotFoundError(f"Dataset file {path} does not exist (datasets load from local paths).")
  if path.endswith(".parquet"):
    try:
      import pyarrow.parquet as pq
    except ImportError as e:
      raise ImportError(f"Reading {path} needs pyarrow: pip install pyarrow.") from e
    return pq.read_table(path).to_pylist()
  rows = []
  with open(path) as f:
    for n, line in enumerate(f, 1):
      if line.strip():
        try:
          rows.append(json.loads(line))
        except json.JSONDecodeError as e:
          raise ValueError(f"{path}:{n} is not valid JSON ({e.msg}).") from e
  return rows


def load_math_dataset(path: str) -> list[MathProblem]:
  """Loads GSM8K-format or generic prompt/answer problems from a local JSONL or parquet file."""
  out = []
  for n, r in enumerate(_records(path), 1):
    if "question" in r and "answer" in r:
      if "####" not in str(r["answer"]):
        raise ValueError(f"{path} record {n}: a GSM8K answer must end with '#### N'.")
      out.append(MathProblem(r["question"], str(r["answer"]).rsplit("####", 1)[1].strip()))
    elif "prompt" in r and "answer" in r:
      out.append(MathProblem(r["prompt"], str(r["answer"]).strip()))
    else:
      raise ValueError(f"{path} record {n} has keys {sorted(r)}; expected question/answer "
                       "(GSM8K) or prompt/answer.")
  if not out:
    raise ValueError(f"{path} holds no problems.")
  return out


def chat_prompt(tokenizer, question: str, instruction: str = INSTRUCTION) -> str:
  """The user turn `question + instruction` rendered with the tokenizer's chat template."""
  content = f"{question}\n{instruction}" if instruction else question
  return tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                       add_generation_prompt=True)
