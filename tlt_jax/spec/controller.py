"""The adaptive part of speculative decoding: when to speculate, which arm, and when to stop.

A shard speculates while its live batch is <= `threshold`; the chooser (the bandit, or the cost
model's predictions) picks an arm per batch bucket among the arms the health monitor still
allows; with no speculative arm left, decoding is plain. A `plain` arm competes with the
proposers on the same footing (tokens per second, or a predicted speed of 1).
"""

from __future__ import annotations

import collections

from tlt_jax.spec.bandit import BucketedEpsilonGreedy
from tlt_jax.spec.cost_chooser import CostChooser
from tlt_jax.spec.costs import CostTable
from tlt_jax.spec.health import HealthMonitor
from tlt_jax.spec.strategy import SpecConfig


class SpecController:
  """What the engine asks before each dispatch: whether to speculate at this batch size and with
  which arm (the chooser's pick among the arms the health monitor has not retired), and what
  it records after (tokens, steps, time). `costs`: the cost model the `cost` chooser needs."""

  def __init__(self, config: SpecConfig, batch_buckets, costs: CostTable | None = None):
    self.config = config
    self.top_bucket = next((b for b in batch_buckets if b >= config.threshold), batch_buckets[-1])
    if config.chooser == "cost":
      if costs is None:
        raise ValueError("spec.chooser='cost' needs a cost table (tlt_jax.drafter.costs."
                         "cost_table_for); use chooser='bandit' to choose by wall time.")
      self.chooser = CostChooser(config.arms, costs, config.rule)
    else:
      self.chooser = BucketedEpsilonGreedy(len(config.arms), config.epsilon, config.window,
                                          config.seed)
    self.health = HealthMonitor([a.name for a in config.arms], config.min_accept_len,
                                config.health_window)
    self.plain_arms = {i for i, a in enumerate(config.arms) if a.is_plain}
    self.tokens = collections.Counter()
    self.row_steps = collections.Counter()

  def reset_stats(self) -> None:
    """Forgets accepted-length counts (not the bandit's rewards): for measuring a later call."""
    self.tokens.clear()
    self.row_steps.clear()

  def may_run(self, bucket: int) -> bool:
    """Whether any speculative executable can be needed at this batch bucket."""
    return bucket <= self.top_bucket

  def is_plain(self, arm: int | None) -> bool:
    """Whether arm `arm` is plain decoding."""
    return arm is None or arm in self.plain_arms

  def choose(self, bucket: int, live: int) -> int | None:
    """The arm for a dispatch at this bucket, or None: decode plainly outside the chooser."""
    allowed = self.health.allowed()
    if live > self.config.threshold or all(a in self.plain_arms for a in allowed):
      return None
    return self.chooser.choose(bucket, allowed)

  def record(self, bucket: int, arm: int, tokens: int, row_steps: int, wall_s: float,
             live: int, apart: str = "") -> None:
    """Records a dispatch (`live` rows at its start; `apart`: why its speed is not the arm's
    own, `CostChooser.update`) for the chooser and its accepted length for the health
    monitor."""
    rate = tokens / max(wall_s, 1e-9)
    if isinstance(self.chooser, CostChooser):
      self.chooser.update(bucket, arm, rate / max(live, 1), apart)
    else:
      self.chooser.update(bucket, arm, rate)
    if arm in self.plain_arms:
      return
    if isinstance(self.chooser, CostChooser):
      self.chooser.observe(arm, tokens, row_steps)
    self.health.record(arm, row_steps, tokens)
    self.tokens[arm] += tokens
    self.row_steps[arm] += row_steps

  def accept_len(self) -> float:
    """Mean tokens emitted per speculative row-step (the bonus token included)."""
    steps = sum(self.row_steps.values())
    return sum(self.tokens.values()) / steps if steps else 0.0

  def counts(self) -> tuple[collections.Counter, collections.Counter]:
    """The accepted-length counts so far (tokens and row-steps per arm): `summary(since=...)`
    reports what came after them."""
    return collections.Counter(self.tokens), collections.Counter(self.row_steps)

  def summary(self, since: tuple[collections.Counter, collections.Counter] | None = None) -> dict:
    """Accepted length (of the dispatches after `since`, from `counts()`; all of them without),
    choices per bucket and arm, retired arms: the rollout record's `spec`."""
    names = [a.name for a in self.config.arms]
    tokens, row_steps = self.tokens, self.row_steps
    if since is not None:
      tokens, row_steps = tokens - since[0], row_steps - since[1]
    steps = sum(row_steps.values())
    by_cost = isinstance(self.chooser, CostChooser)
    best = {b: self.chooser.best(b, list(range(len(names))))
            for b in sorted({b for b, _ in self.chooser.choices})}
    return {
        "accept_len": round(sum(tokens.values()) / steps, 3) if steps else 0.0,
        "accept_len_per_arm": {names[a]: round(tokens[a] / row_steps[a], 3)
                               for a in row_steps if row_steps[a]},
        # The cost chooser's None is plain decoding; the bandit's, no reward yet.
        "chosen_per_bucket": {str(b): "plain" if a is None else names[a]
                              for b, a in best.items() if a is not None or by_cost},
        "retired": {names[a]: round(v, 3) for a, v in self.health.retired.items()},
        "fallback": all(a in self.plain_arms for a in self.health.allowed()),
        "health_events": list(self.health.events),
        **({"predicted_vs_measured": self.chooser.predicted_vs_measured()} if by_cost else {}),
    }
