"""Whether a dispatch replays (`rollout/replay.py`) or decodes: a speed choice, never a token one.

A replay step verifies `chunk` stored tokens per row in one forward, c(B, 1 + chunk), where a
decode step costs c(B, 1): a replaying row emits `accept` tokens per step (its next token and the
stored tokens the current policy still samples), a row that no longer replays one. With `live`
rows of which `replaying` still replay, replay is faster when

    (live - replaying + replaying * accept) / c(B, 1 + chunk) > live / c(B, 1).

`accept` is measured on this engine's replay dispatches: the tokens that the rows replaying at a
dispatch's start emitted, over those rows times the dispatch's steps (a row that leaves replay
during the dispatch counts with the single tokens it emits after, one that finishes with none
after its end, as its slot still costs its share of each step): the first dispatch's figure,
then a running mean. Before any is measured it is `chunk + 1`, so the first dispatch that can
replay does, and measures it. A row that decodes keeps replaying as long as its tokens equal its
stored ones (`ReplayState.after_emit`), so declining to replay at a large batch, where the verify
is dear, leaves its rows to replay at a smaller one. Without the two costs in the table, a
dispatch replays while at least `SHARE` of its live rows still do.
"""

from __future__ import annotations

from tlt_jax.spec.costs import CostTable

DISPATCH_MODES = ("cost", "share")  # `rollout.history.dispatch`
SHARE = 0.5   # without costs: replay while at least this share of the live rows replay
DECAY = 0.3   # weight of the newest dispatch in the running acceptance


class ReplayChoice:
  """The engine's replay-or-decode choice per dispatch, and the acceptance it learns."""

  def __init__(self, chunk: int, costs: CostTable | None = None):
    self.chunk, self.costs = chunk, costs
    self.accept = float(chunk + 1)
    self.measured = False

  def verify_steps(self, b: int) -> float | None:
    """c(B, 1 + chunk) / c(B, 1) at batch bucket `b` (None where the table lacks either)."""
    if self.costs is None:
      return None
    c1, cv = self.costs.target(b, 1), self.costs.target(b, 1 + self.chunk)
    return None if c1 is None or cv is None else cv / c1

  def speedup(self, b: int, live: int, replaying: int) -> float | None:
    """Predicted speed of a replay dispatch against decoding (None: not priced)."""
    steps = self.verify_steps(b)
    if steps is None or not live:
      return None
    return (live - replaying + replaying * self.accept) / (live * steps)

  def replays(self, b: int, live: int, replaying: int) -> bool:
    """Whether the next dispatch of `live` rows at bucket `b`, `replaying` of which replay,
    should replay."""
    if not replaying:
      return False
    speed = self.speedup(b, live, replaying)
    return replaying >= SHARE * live if speed is None else speed > 1.0

  def record(self, tokens: int, rows: int, steps: int) -> None:
    """A replay dispatch of `steps` steps: its `rows` that replayed at its start emitted
    `tokens`."""
    if rows and steps:
      rate = tokens / (rows * steps)
      self.accept = self.accept + DECAY * (rate - self.accept) if self.measured else rate
      self.measured = True
