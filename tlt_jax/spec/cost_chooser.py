"""The `cost` chooser: an arm per batch bucket from the measured cost model, not from wall time.

Each speculative arm's speed against plain decoding is predicted as
`accept_len * c(B, 1) / step(B)` (`spec.costs.CostTable`), its accepted length being the arm's
running mean over every row-step it ran. While that mean is uncertain the chooser scores the arm
by an upper confidence bound: its most tokens per step before `MIN_DISPATCHES` dispatches, then
the mean plus `Z` standard errors (from the spread of its dispatches' means, weighted by their
row-steps). So an arm is tried while it might pay and dropped once it is known not to. Plain
decoding scores 1 and is chosen when no arm's bound is above it. Unlike timing short
dispatches, the step costs come from a table measured once, so the short speculative phase of a
rollout is not spent measuring them.
"""

from __future__ import annotations

import collections
import math

from tlt_jax.spec.costs import CostTable
from tlt_jax.spec.strategy import Strategy


MIN_DISPATCHES = 3
Z = 2.0
# Why a dispatch's measured speed is not its arm's own: it first fed a lazy drafter the tokens
# of the plain steps before it (a cost of switching to the arm, which the per-step prediction
# does not price), or background compiles shared the host with it.
APART = ("catch_up", "compiling")


class CostChooser:
  """Chooses, per batch bucket, the arm with the best predicted speed (plain when none pays);
  the same interface as `bandit.BucketedEpsilonGreedy`."""

  def __init__(self, arms: tuple[Strategy, ...], table: CostTable, rule: str):
    self.arms, self.table, self.rule = arms, table, rule
    self.tokens = collections.Counter()
    self.row_steps = collections.Counter()
    self._moments = collections.defaultdict(lambda: [0, 0.0, 0.0])  # dispatches, sum w^2, w x^2
    self.choices = collections.Counter()
    # (reason, bucket, arm) -> measured tokens/s per live row, all but the arm's first dispatch
    # at the bucket (which may have waited for its program to compile), by why it is not the
    # arm's own speed (`APART`; "": it is)
    self._rates = collections.defaultdict(list)
    self._seen = set()

  def _max_accept(self, a: int) -> int:
    arm = self.arms[a]
    return 1 + (arm.depth if arm.proposer == "tree" else arm.verified(self.rule))

  def accept_len(self, a: int) -> float | None:
    """The arm's mean tokens per row-step so far (None before it ran)."""
    return self.tokens[a] / self.row_steps[a] if self.row_steps[a] else None

  def score(self, bucket: int, a: int, optimistic: bool = True) -> float | None:
    """Predicted speed against plain decoding at `bucket` (1 for plain): with `optimistic`, at
    the upper confidence bound of its accepted length; None where a cost is not in the table."""
    if self.arms[a].is_plain:
      return 1.0
    mean = self.accept_len(a)
    if optimistic:
      accept = min(self._max_accept(a), mean + Z * self._stderr(a)) if mean else None
      accept = self._max_accept(a) if accept is None else accept
    else:
      accept = mean
    return None if accept is None else self.table.speedup(self.arms[a], bucket, accept, self.rule)

  def choose(self, bucket: int, allowed: list[int]) -> int | None:
    """The allowed arm with the best optimistic score; when none scores above 1, the `plain`
    arm, or None (plain decoding) if it is not among the arms."""
    if not allowed:
      raise ValueError("No arm is allowed.")
    scored = [(s, a) for a in allowed if (s := self.score(bucket, a)) is not None]
    plain = next((a for a in allowed if self.arms[a].is_plain), None)
    arm = max(scored, key=lambda x: x[0])[1] if scored and max(scored)[0] > 1.0 else plain
    self.choices[(bucket, arm)] += 1
    return arm

  def _stderr(self, a: int) -> float:
    """The standard error of the arm's accepted length (infinite before `MIN_DISPATCHES`)."""
    m, w2, wx2 = self._moments[a]
    w, mean = self.row_steps[a], self.accept_len(a)
    if m < MIN_DISPATCHES:
      return math.inf
    var = max(wx2 / w - mean * mean, 0.0)
    return math.sqrt(var * w2 / (w * w))  # var / effective number of dispatches

  def observe(self, arm: int, tokens: int, row_steps: int) -> None:
    """Adds a speculative dispatch's emitted tokens and row-steps to the arm's acceptance."""
    if row_steps <= 0:
      return
    self.tokens[arm] += tokens
    self.row_steps[arm] += row_steps
    x = tokens / row_steps
    mom = self._moments[arm]
    mom[0], mom[1], mom[2] = mom[0] + 1, mom[1] + row_steps ** 2, mom[2] + row_steps * x * x

  def update(self, bucket: int, arm: int, reward: float, apart: str = "") -> None:
    """Records a dispatch's measured tokens per second per live row, reported beside the
    prediction; `apart` (one of `APART`) sets it apart from the arm's own speed."""
    if apart not in ("", *APART):
      raise ValueError(f"apart must be '' or one of {APART}, got {apart!r}.")
    if (bucket, arm) in self._seen:
      self._rates[(apart, bucket, arm)].append(float(reward))
    self._seen.add((bucket, arm))

  def best(self, bucket: int, allowed: list[int]) -> int | None:
    """The arm with the best predicted speed at its measured acceptance; the `plain` arm, or
    None (plain decoding), when none is predicted to pay."""
    scored = [(s, a) for a in allowed
              if (s := self.score(bucket, a, optimistic=False)) is not None]
    if scored and max(scored)[0] > 1.0:
      return max(scored)[1]
    return next((a for a in allowed if self.arms[a].is_plain), None)

  def predicted_vs_measured(self) -> dict:
    """Per `bucket/arm` that ran speculatively: the predicted speed against plain decoding at
    its measured acceptance, and the measured one (the median of its dispatches' tokens/s per
    live row over plain's, 1 / c(B, 1) from the table) with the dispatches' count: over those
    that ran the arm's steps alone (`measured`), and apart, over those that first caught a lazy
    drafter up (`measured_catch_up`) or shared the host with background compiles
    (`measured_compiling`)."""
    out = {}
    for b, a in sorted({(b, a) for _, b, a in self._rates}):
      c1 = self.table.target(b, 1)
      if self.arms[a].is_plain or c1 is None:
        continue
      pred = self.score(b, a, optimistic=False)
      cell = {"predicted": None if pred is None else round(pred, 3)}
      for why in ("", *APART):
        rates = self._rates.get((why, b, a), [])
        cell["measured" + (why and f"_{why}")] = round(_median(rates) * c1, 3) if rates else None
        cell[(why and f"{why}_") + "dispatches"] = len(rates)
      out[f"{b}/{self.arms[a].name}"] = cell
    return out


def _median(xs: list[float]) -> float:
  return sorted(xs)[len(xs) // 2]
