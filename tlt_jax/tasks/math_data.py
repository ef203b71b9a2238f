"""Math problems from local dataset files (the formats of `tasks.datasets`), and chat-template
prompt formatting. Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses

from tlt_jax.tasks.datasets import load_examples

INSTRUCTION = "Solve the problem step by step. End with the final answer after '####'."


@dataclasses.dataclass(frozen=True)
class MathProblem:
  """A question and its gold final answer, from a GSM8K-format or prompt/answer dataset."""

  question: str
  answer: str  # the gold final answer, as written (e.g. "1,234" or "3/4")


def load_math_dataset(path: str) -> list[MathProblem]:
  """The problems of a local dataset file in any format `tasks.datasets` reads (GSM8K, MATH,
  verl, prompt/answer); chat-message prompts become their joined text."""
  return [MathProblem(e.text, e.answer) for e in load_examples(path)]


def chat_prompt(tokenizer, question: str, instruction: str = INSTRUCTION) -> str:
  """The user turn `question + instruction` rendered with the tokenizer's chat template."""
  content = f"{question}\n{instruction}" if instruction else question
  return tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                       add_generation_prompt=True)
