"""Accepted-length health monitor: a collapsed proposer is reported and retired, never silent.

Each arm accumulates (speculative row-steps, tokens emitted) over its recent dispatches. Once it
has `window` row-steps, an arm whose mean tokens per step falls below `min_accept_len` is retired
(a broken or stale drafter emits ~1 token per step, which only adds verification cost). When every
arm is retired the engine falls back to plain decoding.
"""

from __future__ import annotations

import logging


class HealthMonitor:
  """Retires an arm whose mean accepted tokens per speculative step falls below
  `min_accept_len` over `window` steps, and records why."""

  def __init__(self, names: list[str], min_accept_len: float, window: int):
    self.names, self.min_accept_len, self.window = names, min_accept_len, window
    self.steps = [0] * len(names)
    self.tokens = [0] * len(names)
    self.retired: dict[int, float] = {}
    self.events: list[str] = []

  def record(self, arm: int, row_steps: int, tokens: int) -> None:
    """Adds a dispatch's speculative row-steps and tokens for `arm`; retires it when its window's
    mean falls below `min_accept_len`."""
    self.steps[arm] += row_steps
    self.tokens[arm] += tokens
    if arm in self.retired or self.steps[arm] < self.window:
      return
    accept = self.tokens[arm] / self.steps[arm]
    if accept < self.min_accept_len:
      self.retired[arm] = accept
      msg = (f"speculation arm {self.names[arm]} collapsed: {accept:.2f} tokens/step over "
             f"{self.steps[arm]} steps (< {self.min_accept_len}); retired")
      self.events.append(msg)
      logging.warning(msg)
    self.steps[arm] = self.tokens[arm] = 0  # judge the next window afresh

  def allowed(self) -> list[int]:
    """The arms not retired."""
    return [a for a in range(len(self.names)) if a not in self.retired]

  @property
  def fallback(self) -> bool:
    """Whether every arm is retired (the engine then decodes plainly)."""
    return not self.allowed()
