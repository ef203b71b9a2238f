"""Speculation strategies (the bandit's arms) and the speculative-decoding configuration."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Strategy:
  """One arm: a proposer and its static shape. `depth` drafts are verified per step. The `plain`
  arm decodes without speculation: with it the bandit keeps plain decoding where no proposer
  pays, so speculation never costs more than its exploration."""

  proposer: str = "suffix"
  depth: int = 4
  ngram: int = 3

  def __post_init__(self):
    if self.proposer not in ("suffix", "eagle", "plain"):
      raise ValueError(f"Unknown proposer {self.proposer!r}; available: 'suffix', 'eagle', "
                       "'plain'.")
    if self.depth < 1 or (self.proposer == "suffix" and self.ngram < 1):
      raise ValueError(f"Strategy depth (and a suffix arm's ngram) must be >= 1, got "
                       f"{self.depth}, {self.ngram}.")

  @property
  def name(self) -> str:
    if self.proposer == "plain":
      return "plain"
    if self.proposer == "eagle":
      return f"eagle_d{self.depth}"
    return f"{self.proposer}_d{self.depth}_n{self.ngram}"


@dataclasses.dataclass(frozen=True)
class SpecConfig:
  """When and how to speculate. SD runs on a shard while its live batch is <= `threshold`."""

  threshold: int = 8
  rule: str = "coupled"               # coupled | rejection
  arms: tuple[Strategy, ...] = (Strategy(depth=2), Strategy(depth=4), Strategy(depth=8))
  epsilon: float = 0.1
  window: int = 300
  min_accept_len: float = 1.15        # health: below this mean tokens/step the arm is retired
  health_window: int = 16             # speculative steps per row-dispatch judged together
  seed: int = 0

  def __post_init__(self):
    if self.rule not in ("coupled", "rejection"):
      raise ValueError(f"rule must be 'coupled' or 'rejection', got {self.rule!r}.")
    if not self.arms:
      raise ValueError("SpecConfig.arms needs at least one strategy.")
    if not 0.0 <= self.epsilon <= 1.0:
      raise ValueError(f"epsilon must be in [0, 1], got {self.epsilon}.")

  @property
  def max_depth(self) -> int:
    return max((a.depth for a in self.arms if a.proposer != "plain"), default=0)


def spec_config_from_dict(d) -> SpecConfig:
  """A `SpecConfig` from an ml-collections dict whose `arms` are (proposer, depth, ngram)."""
  d = dict(d)
  arms = tuple(Strategy(str(a[0]), int(a[1]), int(a[2])) for a in d.pop("arms"))
  return SpecConfig(arms=arms, **d)
