"""The cost model of a speculative step, from measured step times.

c(B, T) is the time of one target forward at batch B with T new tokens per row and the sampling at
each of them (a decode step is c(B, 1), a verify of k drafts c(B, 1 + k)), d(B, T) the same for
the drafter. A speculative step of an arm costs its verify, its draft steps and, for a drafter,
the drafter's reading of the kept tokens; it emits `accept_len` tokens per row where plain
decoding emits one per c(B, 1). So the arm's speed against plain decoding is
`accept_len * c(B, 1) / step(B)`. The tables are measured by `tlt_jax.drafter.costs` (at
start-up, cached per machine) and read by the `cost` chooser.
"""

from __future__ import annotations

import dataclasses
import json

from tlt_jax.spec.proposer import get_proposer
from tlt_jax.spec.strategy import Strategy


def _bucket(b: int, known) -> int | None:
  """The smallest measured batch >= b (the engine's batch buckets round up the same way)."""
  return min((x for x in known if x >= b), default=None)


@dataclasses.dataclass(frozen=True)
class CostTable:
  """Seconds of one target step `target_s[(B, T)]` and one draft step `draft_s[(B, T)]`."""

  target_s: dict
  draft_s: dict = dataclasses.field(default_factory=dict)

  def target(self, b: int, t: int) -> float | None:
    """c(B, T) at the smallest measured batch >= `b` (None if not measured)."""
    bb = _bucket(b, {x for x, _ in self.target_s})
    return self.target_s.get((bb, t))

  def draft(self, b: int, t: int) -> float | None:
    """d(B, T) at the smallest measured batch >= `b` (None if not measured)."""
    bb = _bucket(b, {x for x, _ in self.draft_s})
    return self.draft_s.get((bb, t))

  def step_terms(self, arm: Strategy, b: int, rule: str) -> dict | None:
    """One speculative step of `arm` at batch `b`, by part (seconds): `verify` c(B, 1 + v),
    `draft` (a chain's k steps of one token, a tree's levels of `topk` nodes) and `follow`, the
    drafter reading the kept tokens after the verify; None where a term was not measured."""
    verify = self.target(b, 1 + arm.verified(rule))
    draft = follow = 0.0
    if get_proposer(arm.proposer).uses_draft_model:
      per_level = 1 if arm.proposer == "eagle" else arm.topk
      one, follow = self.draft(b, per_level), self.draft(b, arm.depth)
      draft = None if one is None else arm.depth * one
    if None in (verify, draft, follow):
      return None
    return {"verify": verify, "draft": draft, "follow": follow}

  def speedup(self, arm: Strategy, b: int, accept_len: float, rule: str) -> float | None:
    """Predicted speed of `arm` against plain decoding at batch `b` with `accept_len` tokens per
    row-step (None where a cost was not measured)."""
    terms, c1 = self.step_terms(arm, b, rule), self.target(b, 1)
    if terms is None or c1 is None:
      return None
    return accept_len * c1 / sum(terms.values())

  def to_json(self) -> str:
    """The table as JSON (`from_json` reads it back)."""
    rows = lambda d: [[b, t, s] for (b, t), s in sorted(d.items())]
    return json.dumps({"target_s": rows(self.target_s), "draft_s": rows(self.draft_s)})

  @classmethod
  def from_json(cls, text: str) -> CostTable:
    """The table written by `to_json`."""
    d = json.loads(text)
    table = lambda rows: {(int(b), int(t)): float(s) for b, t, s in rows}
    return cls(table(d["target_s"]), table(d.get("draft_s", [])))
