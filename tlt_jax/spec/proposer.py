"""Proposers behind one interface, registered by name, and the `DraftModel` they may draft with.

A `Strategy` (an arm of the bandit) names a proposer and its shape; the speculative step asks the
proposer for drafts, a chain or a tree, and verifies them exactly whatever they are. Built in:
`suffix` (model-free, `suffix.py`), and `eagle` / `tree`, a chain or an EAGLE-2 tree drafted by the
engine's draft model. A new proposer is one class with the `Proposer` methods plus `register`.

A proposer that `reads_context` keeps per-row state of its own, built from each row's context
(earlier text the caller gives for its prompt, then the prompt) at prefill (`start`) and kept in
step with what the row emits (`after_emit`); the engine holds it in `DecodeState.proposers` under
the proposer's name, compacts it with the rows, and knows nothing of what it holds.

A draft model (the EAGLE drafter, `drafter/proposer.py`) has weights, keeps a cache in step with
the target's, and reads the target's features; the engine holds it only through `DraftModel`, so
`rollout` imports no implementation of it.

Its weights travel as jit arguments: the engine splits `module` once, publishes new weights
between dispatches, and inside a compiled program re-binds the merged module with `bind`. Its
per-row state (cache, last feature, ...) is one batch-leading pytree that lives in
`DecodeState.draft` and is compacted with the rows. Every method is traced inside the engine's
programs, so each takes and returns arrays only.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp
from flax import nnx

from tlt_jax.spec.drafts import BaseProposer, ChainDrafts, ChainProposer, TreeDrafts
from tlt_jax.spec.suffix import SuffixProposer


class Proposer(Protocol):
  """A source of drafts. `arm` is the `Strategy` that names it; `st` the row's `DecodeState`."""

  name: str
  tree: bool               # drafts a tree (verified with a tree mask), else a chain
  uses_draft_model: bool   # drafts with the engine's `DraftModel`
  reads_context: bool      # keeps per-row state from the rows' context (`start`, `after_emit`)
  fields: tuple[str, ...]  # the `Strategy` fields a config tuple gives after the name

  def check(self, arm) -> None:
    """Raises a ValueError naming what is wrong with `arm`'s shape."""

  def arm_name(self, arm) -> str:
    """The arm's name in metrics and the bandit's tables."""

  def verified(self, arm, rule: str) -> int:
    """Draft tokens per verify forward (the root, the row's next token, comes on top)."""

  def written(self, arm, rule: str) -> int:
    """Cache slots written past a row's committed length in one step (drafts only)."""

  def draft(self, target, drafter, st, s0_B: jax.Array, arm, params, key, rule: str,
            live_B: jax.Array) -> ChainDrafts | TreeDrafts:
    """Drafts after (chain) or under (tree) each row's next token `s0`."""

  def start(self, context_BxH: jax.Array, len_B: jax.Array) -> Any:
    """Its per-row state after prefill: each row's context (`context_BxH`, -1 past `len_B`;
    its width leaves room for the whole response)."""

  def after_emit(self, state: Any, tokens_BxM: jax.Array, keep_B: jax.Array) -> Any:
    """Its state after each row emitted the first `keep_B` of `tokens_BxM`."""


class DraftModel(Protocol):
  """A learned proposer that follows the target: the methods the engine calls."""

  module: nnx.Module     # the weights

  def bind(self, module: nnx.Module) -> DraftModel:
    """The same proposer over `module` (merged from the weights a program was given)."""

  @property
  def needs_layers(self) -> bool:
    """Whether the target's forward must return its intermediate layers."""

  @property
  def follows_lazily(self) -> bool:
    """Whether it can catch up from captured final hidden states (`catch_up`), so that plain
    steps need not run it."""

  def init_state(self, target_cfg, batch: int, cache_len: int, attention: str = "xla") -> Any:
    """The state of `batch` rows that have read nothing, for a target cache of `cache_len`
    slots laid out for the `attention` implementation (`kernels.attention`)."""

  def prefill(self, target, state, prompts_UxP: jax.Array, out, lens_U: jax.Array) -> Any:
    """Reads the prompts, given the target's prefill output `out`."""

  def follow(self, target, state, out, inputs_BxT: jax.Array, keep_B: jax.Array,
             t_B: jax.Array, first: int = 0) -> Any:
    """Reads inputs `first .. keep_B` of a target forward `out` over `inputs_BxT`; `t_B` is the
    rows' response length after it."""

  def catch_up(self, target, state, tokens_BxN: jax.Array, hidden_BxNxD: jax.Array,
               prompt_hidden_BxD: jax.Array, done_B: jax.Array, t_B: jax.Array) -> Any:
    """Reads the response tokens emitted since it last read, from their captured hidden states
    (lazy following); a no-op when no live row is behind."""

  def chain(self, target, state, s0_B: jax.Array, k: int, params, key, sample_ids_B: jax.Array,
            t0_B: jax.Array, rule: str, live_B: jax.Array):
    """Drafts `k` tokens after `s0`: (drafts `[B, k]`, q `[B, k, V]`, the `coupled` noise it
    drew at the drafts' positions `[B, k, V]` or None, state)."""

  def tree(self, target, state, s0_B: jax.Array, *, depth: int, topk: int, nodes: int, params,
           key, sample_ids_B: jax.Array, t0_B: jax.Array, rule: str, live_B: jax.Array):
    """Drafts a tree under `s0`: (tokens, valid, parents, depths, ancestor mask, q or None,
    state), the root first."""


class DraftChain(ChainProposer):
  """The `eagle` arms: a chain of `depth` drafts from the draft model."""

  name = "eagle"
  uses_draft_model = True
  fields = ("depth", "ngram")  # ngram unused: ("eagle", depth, 0) as in the configs

  def check(self, arm) -> None:
    """Any depth is valid."""

  def arm_name(self, arm) -> str:
    """`eagle_d<depth>`."""
    return f"eagle_d{arm.depth}"

  def draft(self, target, drafter: DraftModel, st, s0_B, arm, params, key, rule: str,
            live_B) -> ChainDrafts:
    """The drafter's chain of `arm.depth` drafts per row."""
    tokens_BxK, q_BxKxV, noise_BxKxV, draft = drafter.chain(
        target, st.draft, s0_B, arm.depth, params, key, st.address_BxW, st.t_B, rule, live_B)
    return ChainDrafts(tokens_BxK, jnp.ones(tokens_BxK.shape, bool), q_BxKxV, draft,
                       noise_BxKxV)


class DraftTree(BaseProposer):
  """The `tree` arms: an EAGLE-2 dynamic tree from the draft model: `depth` levels, the `topk`
  best nodes of each level expanded with their `topk` best children, and the `nodes` drafts of
  highest cumulative draft score verified in one target forward (under the `rejection` rule
  every drafted node is verified; see `drafter.follow.draft_tree`)."""

  name = "tree"
  tree = True
  uses_draft_model = True
  fields = ("depth", "topk", "nodes")

  def check(self, arm) -> None:
    """Raises where the tree's nodes do not fit its depth and top-k."""
    if not (arm.topk >= 1 and 1 <= arm.nodes <= arm.candidates):
      raise ValueError(f"A tree arm needs topk >= 1 and 1 <= nodes <= {arm.candidates} (the "
                       f"nodes its depth and topk draft), got topk={arm.topk}, "
                       f"nodes={arm.nodes}.")

  def arm_name(self, arm) -> str:
    """`tree_d<depth>_k<topk>_n<nodes>`."""
    return f"tree_d{arm.depth}_k{arm.topk}_n{arm.nodes}"

  def verified(self, arm, rule: str) -> int:
    """Tokens verified per row: the candidates under `rejection`, the nodes under `coupled`."""
    return arm.candidates if rule == "rejection" else arm.nodes

  def written(self, arm, rule: str) -> int:
    # The target's verify, or the drafter's tree of expanded nodes, whichever is more.
    """Cache slots written before commit: every node."""
    return max(self.verified(arm, rule), 1 + (arm.depth - 1) * arm.topk)

  def draft(self, target, drafter: DraftModel, st, s0_B, arm, params, key, rule: str,
            live_B) -> TreeDrafts:
    """The drafter's EAGLE-2 tree of `arm.nodes` drafts per row."""
    return TreeDrafts(*drafter.tree(
        target, st.draft, s0_B, depth=arm.depth, topk=arm.topk, nodes=arm.nodes, params=params,
        key=key, sample_ids_B=st.address_BxW, t0_B=st.t_B, rule=rule, live_B=live_B))


PROPOSERS: dict[str, Proposer] = {}


def register(proposer: Proposer) -> Proposer:
  """Makes `proposer` available to strategies under `proposer.name`."""
  if proposer.name == "plain":
    raise ValueError("'plain' names the arm that decodes without speculation.")
  PROPOSERS[proposer.name] = proposer
  return proposer


def get_proposer(name: str) -> Proposer:
  """The registered proposer `name`; raises naming the known ones."""
  if name not in PROPOSERS:
    raise ValueError(f"Unknown proposer {name!r}; available: "
                     f"{', '.join(repr(n) for n in [*PROPOSERS, 'plain'])}.")
  return PROPOSERS[name]


for _builtin in (SuffixProposer(), DraftChain(), DraftTree()):
  register(_builtin)
