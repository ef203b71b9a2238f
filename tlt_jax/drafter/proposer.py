"""The EAGLE drafter as the rollout engine's draft model (`spec.proposer.DraftModel`).

Build one around a drafter module and give it to the engine:
`RolloutEngine(model, config, spec=spec, drafter=EagleProposer(drafter))`. The decoding itself is
in `follow.py`; this file maps the interface onto it and holds the per-row state.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tlt_jax.drafter import follow
from tlt_jax.drafter.model import Drafter, target_features
from tlt_jax.models import kv_cache as kvc


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FollowState:
  """A drafter's per-row state in `DecodeState.draft` (the invariant is in `follow.py`)."""

  cache: kvc.KVCache
  feat_BxF: jax.Array   # target feature of the last fed token
  dnext_B: jax.Array    # response tokens the drafter has consumed (lazy following)


@dataclasses.dataclass(frozen=True)
class EagleProposer:
  """Implements `spec.proposer.DraftModel` for an EAGLE `Drafter`."""

  module: Drafter

  def bind(self, module: Drafter) -> EagleProposer:
    """This proposer over the drafter `module` (the engine merges the weights it holds)."""
    return EagleProposer(module)

  @property
  def needs_layers(self) -> bool:
    """Whether the target must return its intermediate layers (EAGLE-3 features)."""
    return bool(self.module.cfg.feature_layers)

  @property
  def follows_lazily(self) -> bool:  # fused layer features are not captured: follow eagerly
    """Whether the drafter can catch up from captured hidden states (not with fused features)."""
    return not self.module.cfg.feature_layers

  def init_state(self, target_cfg, batch: int, cache_len: int, attention: str = "xla"
                 ) -> FollowState:
    """The drafter's empty decode state for `batch` rows."""
    width = self.module.cfg.n_features() * target_cfg.d_model
    return FollowState(cache=follow.follow_cache(target_cfg, batch, cache_len, attention),
                       feat_BxF=jnp.zeros((batch, width), jnp.dtype(target_cfg.dtype)),
                       dnext_B=jnp.zeros((batch,), jnp.int32))

  def _features(self, out, dtype) -> jax.Array:
    return target_features(out.layers, out.hidden_BxTxD, self.module.cfg).astype(dtype)

  def prefill(self, target, state: FollowState, prompts_UxP, out, lens_U) -> FollowState:
    # Pairs (x_{t+1}, feature_t) for t < len - 1; the last prompt token's feature waits.
    """The drafter's state after reading the prompts alongside the target's prefill."""
    feats = self._features(out, state.feat_BxF.dtype)
    last_U = lens_U - 1
    cache = follow.consume(self.module, target, state.cache, prompts_UxP[:, 1:], feats[:, :-1],
                           last_U)
    return dataclasses.replace(state, cache=cache,
                               feat_BxF=feats[jnp.arange(lens_U.shape[0]), last_U])

  def follow(self, target, state: FollowState, out, inputs_BxT, keep_B, t_B,
             first: int = 0) -> FollowState:
    # It consumes the pairs (input j, feature before input j) for j in [first, keep).
    """The drafter's state after the target emitted tokens in a plain step (eager following)."""
    feats_BxTxF = self._features(out, state.feat_BxF.dtype)
    before_BxTxF = jnp.concatenate([state.feat_BxF[:, None], feats_BxTxF[:, :-1]], axis=1)
    cache = follow.consume(self.module, target, state.cache, inputs_BxT[:, first:],
                           before_BxTxF[:, first:], jnp.maximum(keep_B - first, 0))
    last_BxF = feats_BxTxF[jnp.arange(keep_B.shape[0]), jnp.maximum(keep_B - 1, 0)]
    return FollowState(cache=cache, dnext_B=t_B,
                       feat_BxF=jnp.where((keep_B > 0)[:, None], last_BxF, state.feat_BxF))

  def catch_up(self, target, state: FollowState, tokens_BxN, hidden_BxNxD, prompt_hidden_BxD,
               done_B, t_B) -> FollowState:
    """Feeds the drafter the tokens it missed while plain steps ran (lazy following)."""
    if hidden_BxNxD.shape[1] == 0 or not self.follows_lazily:
      return state  # nothing captured, or it follows eagerly
    cache, feat_BxF, dnext_B = follow.catch_up(
        self.module, target, state.cache, state.feat_BxF, state.dnext_B, tokens_BxN,
        hidden_BxNxD, prompt_hidden_BxD, done_B, t_B)
    return FollowState(cache=cache, feat_BxF=feat_BxF, dnext_B=dnext_B)

  def chain(self, target, state: FollowState, s0_B, k: int, params, key, sample_ids_B, t0_B,
            rule: str, live_B):
    """A chain of `depth` drafts per row."""
    drafts_BxK, q_BxKxV, noise_BxKxV, cache = follow.draft_chain(
        self.module, target, state.cache, s0_B, state.feat_BxF, k, params, key, sample_ids_B,
        t0_B, rule, live_B)
    return drafts_BxK, q_BxKxV, noise_BxKxV, dataclasses.replace(state, cache=cache)

  def tree(self, target, state: FollowState, s0_B, *, depth: int, topk: int, nodes: int, params,
           key, sample_ids_B, t0_B, rule: str, live_B):
    """An EAGLE-2 dynamic tree of drafts per row."""
    *drafted, cache = follow.draft_tree(
        self.module, target, state.cache, s0_B, state.feat_BxF, depth=depth, topk=topk,
        nodes=nodes, params=params, key=key, sample_ids_B=sample_ids_B, t0_B=t0_B, rule=rule,
        live_B=live_B)
    return (*drafted, dataclasses.replace(state, cache=cache))


def as_proposer(drafter: Drafter | None) -> EagleProposer | None:
  """The engine's draft model for `drafter` (None for none)."""
  return EagleProposer(drafter) if drafter is not None else None
