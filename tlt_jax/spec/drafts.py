"""What a proposer hands the speculative step: a chain or a tree of drafts; and what every chain
proposer shares."""

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


@dataclasses.dataclass(frozen=True)
class TreeDrafts:
  """A tree of drafts under the root `s0` (node 0), verified in one forward with a tree mask."""

  tokens_BxN: jax.Array
  valid_BxN: jax.Array
  parents_BxN: jax.Array     # the root's parent is -1
  depth_BxN: jax.Array
  mask_BxNxN: jax.Array      # node j is node i or one of its ancestors
  q_BxNxV: jax.Array | None  # None: greedy or `coupled`, whose walks never read q
  draft: Any = None


class ChainProposer:
  """A proposer of a chain of `arm.depth` drafts (a base for `spec.proposer.Proposer`s): each
  verify forward checks the `depth` drafts and writes their cache slots."""

  tree = False

  def verified(self, arm, rule: str) -> int:
    return arm.depth

  def written(self, arm, rule: str) -> int:
    return arm.depth
