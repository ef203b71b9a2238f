"""Procedural easy arithmetic word problems, sized for small real models such as SmolLM2-135M.

A problem follows one person's count of one kind of item through `steps` changes (gains, losses,
doubling), with numbers up to `max_value`. The answer is always a non-negative integer.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tlt_jax.tasks import splits
from tlt_jax.tasks.math_data import MathProblem

_NAMES = ["Sam", "Mia", "Leo", "Ava", "Noah", "Zoe", "Eli", "Ivy", "Max", "Lily"]
_ITEMS = ["apples", "marbles", "stickers", "books", "coins", "pencils", "cookies", "shells"]


@dataclasses.dataclass(frozen=True)
class WordProblemConfig:
  """The procedural word problems' difficulty: how many changes, and how large the numbers;
  `test_fraction`: the held-out side's share of prompt space (`tasks/splits.py`)."""

  min_steps: int = 1
  max_steps: int = 2
  max_value: int = 20
  test_fraction: float = 0.1

  def __post_init__(self):
    if not 1 <= self.min_steps <= self.max_steps:
      raise ValueError(f"Need 1 <= min_steps <= max_steps, got {self.min_steps}, {self.max_steps}.")
    if self.max_value < 2:
      raise ValueError(f"max_value must be >= 2, got {self.max_value}.")
    splits.check_fraction(self.test_fraction, "test_fraction")


def make_word_problem(rng: np.random.Generator, cfg: WordProblemConfig) -> MathProblem:
  """One word problem (question, answer) drawn from `rng`."""
  name, item = str(rng.choice(_NAMES)), str(rng.choice(_ITEMS))
  value = int(rng.integers(2, cfg.max_value + 1))
  sentences = [f"{name} has {value} {item}."]
  for _ in range(int(rng.integers(cfg.min_steps, cfg.max_steps + 1))):
    kind = rng.integers(0, 3)
    if kind == 0 or value < 2:
      x = int(rng.integers(1, cfg.max_value + 1))
      sentences.append(f"Then {name} gets {x} more {item}.")
      value += x
    elif kind == 1:
      x = int(rng.integers(1, value))
      sentences.append(f"Then {name} gives {x} {item} to a friend.")
      value -= x
    else:
      sentences.append(f"Then the number of {item} {name} has doubles.")
      value *= 2
  sentences.append(f"How many {item} does {name} have now?")
  return MathProblem(" ".join(sentences), str(value))


def make_word_problems(n: int, cfg: WordProblemConfig, seed: int, split: str) -> list[MathProblem]:
  """`n` word problems from `seed` on `split`'s side of prompt space ("train" or "test":
  distinct, and fewer when the side runs dry)."""
  return splits.draw(lambda rng: make_word_problem(rng, cfg), lambda p: p.question, n, seed,
                     split, cfg.test_fraction)
