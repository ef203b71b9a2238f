"""What a proposer hands the speculative step: a chain or a tree of drafts; and what every
proposer, and every chain proposer, shares."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax


@dataclasses.dataclass(frozen=True)
class ChainDrafts:
  """`k` drafts per row after its next token `s0`, verified as a chain."""

  tokens_BxK: jax.Array
  valid_BxK: jax.Array       # a prefix of each row (an invalid draft ends its chain)
  q_BxKxV: jax.Array | None  # what each draft was drawn from; None: a point mass (deterministic)
  draft: Any = None          # the draft model's state after drafting, if one drafted
  noise_BxKxV: jax.Array | None = None  # `coupled`: the target's noise at the drafts' positions,
  #                                       if the proposer drew it (the verify reuses it)


@dataclasses.dataclass(frozen=True)
class TreeDrafts:
  """A tree of drafts under the root `s0` (node 0), verified in one forward with a tree mask."""

  tokens_BxE: jax.Array
  valid_BxE: jax.Array
  parents_BxE: jax.Array     # the root's parent is -1
  depth_BxE: jax.Array
  mask_BxExE: jax.Array      # node j is node i or one of its ancestors
  q_BxExV: jax.Array | None  # None: greedy or `coupled`, whose walks never read q
  draft: Any = None


class BaseProposer:
  """What a `spec.proposer.Proposer` keeps unless it says otherwise: no per-row state of its
  own (the hooks below are no-ops)."""

  tree = False
  reads_context = False

  def start(self, context_BxH: jax.Array, len_B: jax.Array) -> Any:
    """The proposer's per-row state from the rows' context at prefill (None: it keeps none)."""
    return None

  def after_emit(self, state: Any, tokens_BxM: jax.Array, keep_B: jax.Array) -> Any:
    """The per-row state after the rows emitted `tokens_BxM` (`keep_B` of them)."""
    return state


class ChainProposer(BaseProposer):
  """A proposer of a chain of `arm.depth` drafts (a base for `spec.proposer.Proposer`s): each
  verify forward checks the `depth` drafts and writes their cache slots."""

  def verified(self, arm, rule: str) -> int:
    """Tokens a chain arm verifies per row: its depth."""
    return arm.depth

  def written(self, arm, rule: str) -> int:
    """Cache slots a chain arm writes before commit: its depth."""
    return arm.depth
