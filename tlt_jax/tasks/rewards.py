"""Rewards by name (`task.reward`), each a function `(response_text, answer) -> float`:

  math     1 when the response's final number equals the answer (`math_answers.verify`)
  boxed    1 when the last `\\boxed{...}` is mathematically equivalent to the answer, by Hugging
           Face's `math-verify` (the optional extra `math`: `pip install 'tlt_jax[math]'`)
  format   1 when the response gives its final answer where the prompt asked for it (`#### N`
           or `\\boxed{...}`)
  a+b      the sum of named rewards, e.g. `math+format`
  module:function   the user's own, in one of three forms told apart by its parameters' names:
           ours        `(response_text, answer) -> float`
           verl's      `(data_source, solution_str, ground_truth, extra_info=None) -> float`:
                       `data_source` the row's column of that name, else the dataset file's
                       name; `extra_info` the row's other columns (its own `extra_info` column's
                       keys merged in)
           TRL's       `(prompts, completions, **columns) -> list[float]`, batched: the prompts'
                       and responses' texts, each dataset column as a list (the gold answer as
                       `answer`), one entry per row

A run scores a rollout in one call (`batch_reward`). An unknown name, an unimportable path or a
signature of none of these forms is a one-line error before any work.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable

from tlt_jax.errors import ConfigError
from tlt_jax.tasks.math_answers import boxed_content, verify

RewardFn = Callable[[str, str], float]
# (response texts, their rows as `datasets.Example`) -> one reward per row
BatchReward = Callable[[list, list], list]
_STATED = re.compile(r"####\s*\S|\\boxed\{")


def math_reward(response: str, answer: str) -> float:
  """1.0 when the response's final number equals `answer`."""
  return verify(response, answer)


def format_reward(response: str, answer: str) -> float:
  """1.0 when the response states its final answer after `####` or in `\\boxed{...}`."""
  del answer
  return 1.0 if _STATED.search(response) else 0.0


def _math_verify():
  """math-verify, the optional extra `math` that only the `boxed` reward needs (`reward_fn`
  checks), or None; imported on first use: it brings sympy, 0.7 s of every launcher's start."""
  try:
    import math_verify
  except ImportError:
    return None
  return math_verify


def boxed_reward(response: str, answer: str) -> float:
  """1.0 when the response's last `\\boxed{...}` is equivalent to `answer` (math-verify)."""
  got = boxed_content(response)
  if got is None:
    return 0.0
  math_verify = _math_verify()
  gold = math_verify.parse(f"${answer}$")
  return 1.0 if math_verify.verify(gold, math_verify.parse(f"${got}$")) else 0.0


REWARDS: dict[str, RewardFn] = {"math": math_reward, "boxed": boxed_reward,
                                "format": format_reward}


def reward_fn(name: str) -> RewardFn:
  """The reward `name` of one response (see the module docstring; a user's function of our form
  too); raises `ConfigError` naming the problem."""
  at = f"config.task.reward={name!r}"
  if ":" in name:
    fn, form = _user_reward(name, at)
    if form != "text":
      raise ConfigError(f"{at}: a {form} reward scores rows, not a text and an answer; use "
                        "batch_reward.")
    return fn
  parts = [p.strip() for p in name.split("+")]
  unknown = [p for p in parts if p not in REWARDS]
  if unknown:
    raise ConfigError(f"{at}: {unknown[0]!r} is not a reward; known: {', '.join(REWARDS)}, sums "
                      "such as math+format, or module:function.")
  if "boxed" in parts and _math_verify() is None:
    raise ConfigError(f"{at} needs math-verify: pip install 'tlt_jax[math]' (or math-verify).")
  fns = [REWARDS[p] for p in parts]
  if len(fns) == 1:
    return fns[0]
  return lambda response, answer: float(sum(f(response, answer) for f in fns))


def batch_reward(name: str) -> BatchReward:
  """The reward `name` over a batch: `(response texts, rows) -> rewards`, each row an `Example`
  (its prompt, answer, source file and columns); every form of the module docstring."""
  at = f"config.task.reward={name!r}"
  if ":" not in name:
    fn = reward_fn(name)
    return lambda texts, rows: [fn(t, r.answer) for t, r in zip(texts, rows)]
  fn, form = _user_reward(name, at)
  if form == "text":
    return lambda texts, rows: [fn(t, r.answer) for t, r in zip(texts, rows)]
  if form == "verl":
    return lambda texts, rows: [fn(_data_source(r), t, r.answer, _extra_info(r))
                                for t, r in zip(texts, rows)]

  def trl(texts, rows):
    names = dict.fromkeys(k for r in rows for k in r.columns if k not in ("prompt", "answer"))
    out = fn(prompts=[r.text for r in rows], completions=list(texts),
             answer=[r.answer for r in rows],
             **{k: [r.columns.get(k) for r in rows] for k in names})
    if len(out) != len(rows):
      raise ValueError(f"{name} returned {len(out)} rewards for {len(rows)} completions.")
    return out
  return trl


def _data_source(row) -> str:
  return str(row.columns.get("data_source") or row.source)


def _extra_info(row) -> dict:
  extra = row.columns.get("extra_info")
  other = {k: v for k, v in row.columns.items() if k not in ("prompt", "data_source")}
  return {**other, **(extra if isinstance(extra, dict) else {})}


_FORMS = ("(response_text, answer) -> float, verl's (data_source, solution_str, ground_truth, "
          "extra_info) -> float or TRL's (prompts, completions, **columns) -> list[float]")


def _user_reward(name: str, at: str) -> tuple[Callable, str]:
  """The user's function and its form ("text", "verl" or "trl"), told apart by its parameters'
  names."""
  module, _, function = name.partition(":")
  try:
    fn = getattr(importlib.import_module(module), function)
  except (ImportError, AttributeError) as e:
    raise ConfigError(f"{at}: cannot import it ({type(e).__name__}: {e}).") from None
  try:
    params = list(inspect.signature(fn).parameters.values())
  except (TypeError, ValueError):
    params = []
  names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  if not callable(fn):
    raise ConfigError(f"{at}: a reward must be a function: {_FORMS}.")
  if {"data_source", "solution_str", "ground_truth"} <= set(names):
    return fn, "verl"
  if names[:2] == ["prompts", "completions"] and any(p.kind == p.VAR_KEYWORD for p in params):
    return fn, "trl"
  if len(names) >= 2 and "completions" not in names:
    return fn, "text"
  raise ConfigError(f"{at}: its parameters ({', '.join(p.name for p in params)}) fit no "
                    f"reward form; a reward is {_FORMS}.")
