"""Speculation strategies (the bandit's arms) and the speculative-decoding configuration."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Strategy:
  """One arm: a proposer and its static shape. The `plain` arm decodes without speculation:
  with it the bandit keeps plain decoding where no proposer pays, so speculation never costs
  more than its exploration.

  - `suffix` / `eagle`: a chain of `depth` drafts (`ngram`: the suffix proposer's match length).
  - `tree`: an EAGLE-2 dynamic tree drafted by the EAGLE drafter: `depth` levels, the `topk`
    best nodes of each level expanded with their `topk` best children, and the `nodes` drafts
    of highest cumulative draft score verified in one target forward (under the `rejection`
    rule every drafted node is verified; see `drafter.follow.draft_tree`).
  """

  proposer: str = "suffix"
  depth: int = 4
  ngram: int = 3
  topk: int = 1
  nodes: int = 0

  def __post_init__(self):
    if self.proposer not in ("suffix", "eagle", "tree", "plain"):
      raise ValueError(f"Unknown proposer {self.proposer!r}; available: 'suffix', 'eagle', "
                       "'tree', 'plain'.")
    if self.depth < 1 or (self.proposer == "suffix" and self.ngram < 1):
      raise ValueError(f"Strategy depth (and a suffix arm's ngram) must be >= 1, got "
                       f"{self.depth}, {self.ngram}.")
    if self.proposer == "tree" and not (self.topk >= 1 and 1 <= self.nodes <= self.candidates):
      raise ValueError(f"A tree arm needs topk >= 1 and 1 <= nodes <= {self.candidates} (the "
                       f"nodes its depth and topk draft), got topk={self.topk}, "
                       f"nodes={self.nodes}.")

  @property
  def uses_drafter(self) -> bool:
    return self.proposer in ("eagle", "tree")

  @property
  def candidates(self) -> int:
    """Drafted tree nodes: the root's `topk` children, then `topk` x `topk` per deeper level."""
    return self.topk + (self.depth - 1) * self.topk * self.topk

  def verified(self, rule: str) -> int:
    """Draft tokens per verify forward (the root, the row's next token, comes on top)."""
    if self.proposer != "tree":
      return self.depth
    return self.candidates if rule == "rejection" else self.nodes

  def written(self, rule: str) -> int:
    """Cache slots written past a row's committed length in one step, drafts only (the
    target's verify, or the drafter's tree of expanded nodes, whichever is more)."""
    if self.proposer != "tree":
      return self.depth
    return max(self.verified(rule), 1 + (self.depth - 1) * self.topk)

  @property
  def name(self) -> str:
    if self.proposer == "plain":
      return "plain"
    if self.proposer == "eagle":
      return f"eagle_d{self.depth}"
    if self.proposer == "tree":
      return f"tree_d{self.depth}_k{self.topk}_n{self.nodes}"
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
  def max_written(self) -> int:
    """The most draft slots any arm writes into a cache in one step (the cache's slack)."""
    return max((a.written(self.rule) for a in self.arms if a.proposer != "plain"), default=0)


def strategy_from_tuple(arm) -> Strategy:
  """(proposer, depth, ngram) for chains, (`'tree'`, depth, topk, nodes) for trees, ('plain',)."""
  name = str(arm[0])
  if name == "tree":
    if len(arm) != 4:
      raise ValueError(f"A tree arm is ('tree', depth, topk, nodes), got {tuple(arm)}.")
    return Strategy("tree", int(arm[1]), topk=int(arm[2]), nodes=int(arm[3]))
  return Strategy(name, *(int(x) for x in arm[1:3]))


def spec_config_from_dict(d) -> SpecConfig:
  """A `SpecConfig` from an ml-collections dict whose `arms` are tuples (`strategy_from_tuple`)."""
  d = dict(d)
  arms = tuple(strategy_from_tuple(a) for a in d.pop("arms"))
  return SpecConfig(arms=arms, **d)
