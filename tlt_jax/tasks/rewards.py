"""Rewards by name (`task.reward`), each a function `(response_text, answer) -> float`:

  math     1 when the response's final number equals the answer (`math_answers.verify`)
  boxed    1 when the last `\\boxed{...}` is mathematically equivalent to the answer, by Hugging
           Face's `math-verify` (the optional extra `math`: `pip install 'tlt_jax[math]'`)
  format   1 when the response gives its final answer where the prompt asked for it (`#### N`
           or `\\boxed{...}`)
  a+b      the sum of named rewards, e.g. `math+format`
  module:function   the user's own `(response_text, answer) -> float`

An unknown name, an unimportable path or a wrong signature is a one-line error before any work.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable

from tlt_jax.errors import ConfigError
from tlt_jax.tasks.math_answers import boxed_content, verify

try:  # the optional extra `math`: only the `boxed` reward needs it (`reward_fn` checks)
  import math_verify
except ImportError:
  math_verify = None

RewardFn = Callable[[str, str], float]
_STATED = re.compile(r"####\s*\S|\\boxed\{")


def math_reward(response: str, answer: str) -> float:
  """1.0 when the response's final number equals `answer`."""
  return verify(response, answer)


def format_reward(response: str, answer: str) -> float:
  """1.0 when the response states its final answer after `####` or in `\\boxed{...}`."""
  del answer
  return 1.0 if _STATED.search(response) else 0.0


def boxed_reward(response: str, answer: str) -> float:
  """1.0 when the response's last `\\boxed{...}` is equivalent to `answer` (math-verify)."""
  got = boxed_content(response)
  if got is None:
    return 0.0
  gold = math_verify.parse(f"${answer}$")
  return 1.0 if math_verify.verify(gold, math_verify.parse(f"${got}$")) else 0.0


REWARDS: dict[str, RewardFn] = {"math": math_reward, "boxed": boxed_reward,
                                "format": format_reward}


def reward_fn(name: str) -> RewardFn:
  """The reward `name` (see the module docstring); raises `ConfigError` naming the problem."""
  at = f"config.task.reward={name!r}"
  if ":" in name:
    return _user_reward(name, at)
  parts = [p.strip() for p in name.split("+")]
  unknown = [p for p in parts if p not in REWARDS]
  if unknown:
    raise ConfigError(f"{at}: {unknown[0]!r} is not a reward; known: {', '.join(REWARDS)}, sums "
                      "such as math+format, or module:function.")
  if "boxed" in parts and math_verify is None:
    raise ConfigError(f"{at} needs math-verify: pip install 'tlt_jax[math]' (or math-verify).")
  fns = [REWARDS[p] for p in parts]
  if len(fns) == 1:
    return fns[0]
  return lambda response, answer: float(sum(f(response, answer) for f in fns))


def _user_reward(name: str, at: str) -> RewardFn:
  module, _, function = name.partition(":")
  try:
    fn = getattr(importlib.import_module(module), function)
  except (ImportError, AttributeError) as e:
    raise ConfigError(f"{at}: cannot import it ({type(e).__name__}: {e}).") from None
  try:
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  except (TypeError, ValueError):
    params = []
  if not callable(fn) or len(params) < 2:
    raise ConfigError(f"{at}: a reward must be a function (response_text, answer) -> float.")
  return fn
