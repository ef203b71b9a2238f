"""The built-in long-tail reasoning task: chained addition/subtraction with a scratchpad.

A prompt is a chain such as `7-3+9+0=`; the solution works it left to right, one step per
`a+b=c;`, and ends with `#answer`. The number of steps follows a truncated power law, so most
solutions are short and a few are many times longer: the long tail of reasoning-RL rollouts in
miniature. Each step is a chance to err, so success falls with length and groups of samples of one
prompt often get mixed rewards, which is what GRPO learns from.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from tlt_jax.models.tokenizer import CharTokenizer
from tlt_jax.tasks import splits


@dataclasses.dataclass(frozen=True)
class TaskConfig:
  """Difficulty mix: P(steps = k) is proportional to k ** -alpha for k in [min_steps, max_steps].
  `test_fraction`: the held-out side's share of prompt space (`tasks/splits.py`); a fifth, so
  that even the ~150 one-step prompts leave a few dozen distinct held-out ones."""

  min_steps: int = 1
  max_steps: int = 16
  alpha: float = 1.3
  max_operand: int = 9
  test_fraction: float = 0.2

  def __post_init__(self):
    if not 1 <= self.min_steps <= self.max_steps:
      raise ValueError(f"Need 1 <= min_steps <= max_steps, got {self.min_steps}, {self.max_steps}.")
    if self.max_operand < 1:
      raise ValueError(f"max_operand must be >= 1, got {self.max_operand}.")
    splits.check_fraction(self.test_fraction, "test_fraction")

  @classmethod
  def from_dict(cls, d) -> "TaskConfig":
    """From a config section's generator fields."""
    return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})

  def max_prompt_chars(self) -> int:
    """The longest prompt the generator can make, in characters."""
    return (self.max_steps + 1) * (len(str(self.max_operand)) + 1)

  def max_solution_chars(self) -> int:
    """The longest scratchpad solution, in characters."""
    top = (self.max_steps + 1) * self.max_operand
    return self.max_steps * (2 * len(str(top)) + len(str(self.max_operand)) + 3) + len(str(top)) + 1


@dataclasses.dataclass(frozen=True)
class Problem:
  """One generated arithmetic problem: its prompt, scratchpad solution, answer and step count."""

  prompt: str
  solution: str
  answer: int
  steps: int


def step_probs(cfg: TaskConfig) -> np.ndarray:
  """The truncated power law over step counts (`alpha`)."""
  k = np.arange(cfg.min_steps, cfg.max_steps + 1, dtype=np.float64)
  p = k ** -cfg.alpha
  return p / p.sum()


def make_problem(rng: np.random.Generator, cfg: TaskConfig) -> Problem:
  """One problem drawn from `rng`."""
  steps = int(rng.choice(np.arange(cfg.min_steps, cfg.max_steps + 1), p=step_probs(cfg)))
  value = int(rng.integers(0, cfg.max_operand + 1))
  prompt, lines = [str(value)], []
  for _ in range(steps):
    x = int(rng.integers(0, cfg.max_operand + 1))
    op = "-" if (x <= value and rng.random() < 0.5) else "+"
    new = value - x if op == "-" else value + x
    prompt.append(f"{op}{x}")
    lines.append(f"{value}{op}{x}={new};")
    value = new
  return Problem("".join(prompt) + "=", "".join(lines) + f"#{value}", value, steps)


def make_problems(n: int, cfg: TaskConfig, seed: int, split: str) -> list[Problem]:
  """`n` problems from `seed` on `split`'s side of prompt space ("train" or "test": distinct,
  and fewer when the side runs dry)."""
  return splits.draw(lambda rng: make_problem(rng, cfg), lambda p: p.prompt, n, seed, split,
                     cfg.test_fraction)


_FORMAT = re.compile(r"^(\d+[+-]\d+=\d+;)*#(\d+)$")


def reward(response: str, answer: int) -> float:
  """1.0 for a well-formed scratchpad ending in `#answer`; 0.0 for a wrong or malformed one."""
  m = _FORMAT.match(response)
  if m is None:
    return 0.0
  return 1.0 if int(m.group(2)) == answer else 0.0


def progress_reward(response: str, problem: Problem) -> float:
  """A denser reward for RL: 1.0 for a correct answer (as `reward`), else half the fraction of the
  reference scratchpad's steps that the response got right before its first wrong step. Samples
  of one prompt that fail at different steps then get different rewards, which tells the policy
  where its chains break; only a correct answer scores 1.0, so accuracy is `reward == 1`."""
  if reward(response, problem.answer) == 1.0:
    return 1.0
  want = problem.solution.split("#")[0].split(";")[:-1]
  got = response.split("#")[0].split(";")
  right = 0
  for w, g in zip(want, got):
    if w != g:
      break
    right += 1
  return 0.5 * right / len(want)


def encode_prompt(tok: CharTokenizer, problem: Problem) -> list[int]:
  """BOS then the prompt's characters."""
  return [tok.bos_id] + tok.encode(problem.prompt)


def encode_solution(tok: CharTokenizer, problem: Problem) -> list[int]:
  """The solution's characters then EOS."""
  return tok.encode(problem.solution) + [tok.eos_id]
