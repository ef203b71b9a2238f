"""What the rollout engine knows of a draft model: the `DraftModel` interface.

Proposers come in two kinds. Model-free ones (`suffix.py`) are pure functions of a row's token
history. A draft model (the EAGLE drafter, `drafter/proposer.py`) has weights, keeps a cache in
step with the target's, and reads the target's features; the engine holds it only through this
interface, so `rollout` imports no implementation of it.

Its weights travel as jit arguments: the engine splits `module` once, publishes new weights
between dispatches, and inside a compiled program re-binds the merged module with `bind`. Its
per-row state (cache, last feature, ...) is one batch-leading pytree that lives in
`DecodeState.draft` and is compacted with the rows. Every method is traced inside the engine's
programs, so each takes and returns arrays only.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
from flax import nnx


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

  def init_state(self, target_cfg, batch: int, cache_len: int) -> Any:
    """The state of `batch` rows that have read nothing, for a target cache of `cache_len`."""

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
    """Drafts `k` tokens after `s0`: (drafts `[B, k]`, q `[B, k, V]`, state)."""

  def tree(self, target, state, s0_B: jax.Array, *, depth: int, topk: int, nodes: int, params,
           key, sample_ids_B: jax.Array, t0_B: jax.Array, rule: str, live_B: jax.Array):
    """Drafts a tree under `s0`: (tokens, valid, parents, depths, ancestor mask, q or None,
    state), the root first."""
