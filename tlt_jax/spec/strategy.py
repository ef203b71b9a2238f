"""Speculation strategies (the bandit's arms) and the speculative-decoding configuration."""

from __future__ import annotations

import dataclasses

from tlt_jax.errors import ConfigError
from tlt_jax.spec.proposer import get_proposer
from tlt_jax.typed import typed


@dataclasses.dataclass(frozen=True)
class Strategy:
  """One arm: a registered proposer (`spec.proposer`) and its static shape, or the `plain` arm,
  which decodes without speculation: with it the bandit keeps plain decoding where no proposer
  pays, so speculation never costs more than its exploration.

  - `suffix` / `eagle`: a chain of `depth` drafts (`ngram`: the suffix proposer's match length).
  - `tree`: an EAGLE-2 dynamic tree of `depth` levels, `topk` children per expanded node, the
    `nodes` best drafts verified (`spec.proposer.DraftTree`).
  """

  proposer: str = "suffix"
  depth: int = 4
  ngram: int = 3
  topk: int = 1
  nodes: int = 0

  def __post_init__(self):
    if self.depth < 1:
      raise ValueError(f"Strategy depth must be >= 1, got {self.depth}.")
    if not self.is_plain:
      get_proposer(self.proposer).check(self)

  @property
  def is_plain(self) -> bool:
    """Whether this arm is plain decoding."""
    return self.proposer == "plain"

  @property
  def uses_drafter(self) -> bool:
    """Whether this arm drafts with the engine's draft model."""
    return not self.is_plain and get_proposer(self.proposer).uses_draft_model

  @property
  def candidates(self) -> int:
    """Drafted tree nodes: the root's `topk` children, then `topk` x `topk` per deeper level."""
    return self.topk + (self.depth - 1) * self.topk * self.topk

  def verified(self, rule: str) -> int:
    """Draft tokens per verify forward (the root, the row's next token, comes on top)."""
    return 0 if self.is_plain else get_proposer(self.proposer).verified(self, rule)

  def written(self, rule: str) -> int:
    """Cache slots written past a row's committed length in one step (drafts only)."""
    return 0 if self.is_plain else get_proposer(self.proposer).written(self, rule)

  @property
  def name(self) -> str:
    """The arm's name in metrics and records (e.g. `eagle_d3`)."""
    return "plain" if self.is_plain else get_proposer(self.proposer).arm_name(self)


@dataclasses.dataclass(frozen=True)
class SpecConfig:
  """When and how to speculate. SD runs on a shard while its live batch is <= `threshold`.

  `chooser` picks the arm per batch bucket: `bandit` by measured tokens per second (epsilon-
  greedy, `spec.bandit`), `cost` by the speed the measured cost model predicts at each arm's
  running acceptance (`spec.cost_chooser`; the engine then needs a `spec.costs.CostTable`).
  """

  threshold: int = 8
  rule: str = "coupled"               # coupled | rejection
  # the chooser's arms: (proposer, depth, ...) tuples in a config (`strategy_from_tuple`)
  arms: tuple[Strategy, ...] = (Strategy(depth=2), Strategy(depth=4), Strategy(depth=8))
  epsilon: float = 0.1                # the bandit's exploration rate
  window: int = 300                   # the bandit's recent dispatches per arm and bucket
  min_accept_len: float = 1.05        # health: below this mean tokens/step the arm is retired
  health_window: int = 64             # speculative steps per row-dispatch judged together
  seed: int = 0                       # the bandit's exploration draws
  chooser: str = "bandit"             # bandit | cost

  def __post_init__(self):
    if self.chooser not in ("bandit", "cost"):
      raise ValueError(f"chooser must be 'bandit' or 'cost', got {self.chooser!r}.")
    if self.rule not in ("coupled", "rejection"):
      raise ValueError(f"rule must be 'coupled' or 'rejection', got {self.rule!r}.")
    if not self.arms:
      raise ValueError("SpecConfig.arms needs at least one strategy.")
    if not 0.0 <= self.epsilon <= 1.0:
      raise ValueError(f"epsilon must be in [0, 1], got {self.epsilon}.")

  @property
  def max_written(self) -> int:
    """The most draft slots any arm writes into a cache in one step (the cache's slack)."""
    return max((a.written(self.rule) for a in self.arms), default=0)


def strategy_from_tuple(arm) -> Strategy:
  """An arm from a config tuple: the proposer's name, then (some of) its `fields`:
  ('suffix', depth, ngram), ('eagle', depth, 0), ('tree', depth, topk, nodes), or ('plain',)."""
  name = str(arm[0])
  fields = ("depth", "ngram") if name == "plain" else get_proposer(name).fields  # plain: unused
  form = f"A {name!r} arm is ({name!r}, {', '.join(fields)}), got {tuple(arm)}."
  if len(arm) - 1 > len(fields):
    raise ValueError(form)
  try:
    return Strategy(name, **{f: int(x) for f, x in zip(fields, arm[1:])})
  except ValueError as e:  # e.g. a field left out whose default does not fit
    raise ValueError(f"{e} {form}") from None


def spec_config_from_dict(d, key: str = "spec") -> SpecConfig:
  """A `SpecConfig` from a config section whose `arms` are tuples (`strategy_from_tuple`); `key`:
  where it sits, for the error messages."""

  def arms(tuples):
    try:
      return tuple(strategy_from_tuple(a) for a in tuples)
    except ValueError as e:
      raise ConfigError(f"config.{key}.arms: {e}") from None

  return typed(SpecConfig, d, key, arms=arms)
