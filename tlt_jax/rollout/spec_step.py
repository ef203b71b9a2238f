"""One speculative decode step: propose, verify exactly in one target forward, commit.

It follows `rollout.state`'s invariant: the row's next token `s0` is sampled (or forced) as
plain decoding would, drafts `d1..dk` are proposed after it, and `[s0, d1..dk]` go through the
target at positions `len .. len + k`. Kept tokens, their log-probs and the hidden states of the
inputs that fed them are recorded; the cache keeps exactly the kept prefix. The replay step
(`rollout/replay.py`) is a chain step whose drafts are a row's stored response.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from tlt_jax.models import kv_cache as kvc
from tlt_jax.models.sampling import SamplingParams, processed_logprobs
from tlt_jax.rollout.replay import replay_drafts
from tlt_jax.rollout.state import DecodeState, emit, follow_drafter, needs_layers, next_token
from tlt_jax.spec import verify
from tlt_jax.spec.drafts import ChainDrafts, TreeDrafts
from tlt_jax.spec.proposer import DraftModel, get_proposer
from tlt_jax.spec.strategy import Strategy


def spec_step(model, drafter: DraftModel | None, st: DecodeState, params: SamplingParams, key,
              stop_ids, n: int, pad_id: int, *, strategy: Strategy, rule: str) -> DecodeState:
  """One speculative step of every row: the drafter catches up (when it drafts), the proposer
  drafts a chain or tree, one target forward verifies it under `rule`, and the accepted prefix
  (or tree path) plus one token is committed."""
  proposer = get_proposer(strategy.proposer)
  if proposer.uses_draft_model:
    st = dataclasses.replace(st, draft=drafter.catch_up(
        model, st.draft, st.tokens_BxN, st.captured.hidden_BxNxD, st.captured.prompt_hidden_BxD,
        st.done_B, st.t_B))
  live_B = ~st.done_B
  s0_B, lp0_B = next_token(st, params, key, model.cfg.numerics)
  s0_B = jnp.where(live_B, s0_B, pad_id)
  drafts = proposer.draft(model, drafter, st, s0_B, strategy, params, key, rule, live_B)
  if proposer.tree:
    return _tree_step(model, drafter, st, s0_B, lp0_B, drafts, params, key, stop_ids, n, pad_id,
                      rule=rule, depth=strategy.depth)
  return _chain_step(model, drafter, st, s0_B, lp0_B, drafts, params, key, stop_ids, n, pad_id,
                     rule=rule)


def replay_step(model, drafter: DraftModel | None, st: DecodeState, params: SamplingParams, key,
                stop_ids, n: int, pad_id: int, *, chunk: int, follow: bool) -> DecodeState:
  """One replay step of every row (`rollout/replay.py`): `chunk` stored tokens after the row's
  next token verified under `coupled` (a row not replaying emits its next token alone). The
  drafter follows the kept tokens unless `follow` is off (lazy following: it catches up from the
  captured hidden states when it next drafts)."""
  live_B = ~st.done_B
  s0_B, lp0_B = next_token(st, params, key, model.cfg.numerics)
  s0_B = jnp.where(live_B, s0_B, pad_id)
  new = _chain_step(model, drafter, st, s0_B, lp0_B, replay_drafts(st, s0_B, chunk), params, key,
                    stop_ids, n, pad_id, rule="coupled", follow=follow)
  replayed_B = st.replay.emitted_B + jnp.where(st.replay.on_B, new.t_B - st.t_B, 0)
  return dataclasses.replace(new, replay=dataclasses.replace(new.replay, emitted_B=replayed_B))


def _chain_step(model, drafter: DraftModel | None, st: DecodeState, s0_B, lp0_B,
                drafts: ChainDrafts, params: SamplingParams, key, stop_ids, n: int, pad_id: int,
                *, rule: str, follow: bool = True) -> DecodeState:
  """Verifies a chain `[s0, d1 .. dk]` in one target forward and commits the kept prefix."""
  b, k = drafts.tokens_BxK.shape
  rows = jnp.arange(b)
  live_B = ~st.done_B
  valid_BxK, q_BxKxV, draft = drafts.valid_BxK, drafts.q_BxKxV, drafts.draft
  n_valid_B = jnp.sum(valid_BxK, axis=1)
  drafts_BxK = jnp.where(valid_BxK, drafts.tokens_BxK, pad_id)

  inputs_BxM = jnp.concatenate([s0_B[:, None], drafts_BxK], axis=1)
  out = model(inputs_BxM, st.cache, return_layers=needs_layers(drafter))
  # p_1 .. p_k
  logp_BxKxV = processed_logprobs(out.logits_BxTxV[:, :k], params, model.cfg.numerics)
  if rule == "coupled" or params.greedy:
    n_acc_B, forced_B = verify.verify_chain_coupled(
        logp_BxKxV, jnp.where(valid_BxK, drafts_BxK, -1), key, st.address_BxW, st.t_B,
        params.greedy, drafts.noise_BxKxV)
  else:
    q = verify.point_mass(drafts_BxK, logp_BxKxV.shape[-1]) if q_BxKxV is None else q_BxKxV
    n_acc_B, forced_B = verify.verify_chain_rejection(logp_BxKxV, drafts_BxK, q, key,
                                                      st.address_BxW, st.t_B)
    forced_B = jnp.where(n_acc_B < n_valid_B, forced_B, -1)  # a short chain is not a rejection
  n_acc_B = jnp.minimum(n_acc_B, n_valid_B)

  cand_BxM = jnp.concatenate([s0_B[:, None], drafts_BxK], axis=1)
  draft_lp_BxK = jnp.take_along_axis(logp_BxKxV, drafts_BxK[:, :, None], axis=2)[:, :, 0]
  cand_lp_BxM = jnp.concatenate([lp0_B[:, None], draft_lp_BxK], axis=1)
  m_B = n_acc_B + 1
  new, keep_B = emit(st, cand_BxM, cand_lp_BxM, out.hidden_BxTxD, m_B, stop_ids, n, pad_id)
  last_logits = out.logits_BxTxV[rows, jnp.maximum(keep_B - 1, 0)]
  new = dataclasses.replace(
      new, cache=kvc.commit(out.cache, keep_B),
      logits_BxV=jnp.where((keep_B > 0)[:, None], last_logits, st.logits_BxV),
      spec=st.spec.after_step(keep_B, m_B, forced_B, live_B))
  if not follow:
    return new
  # The drafter consumed (s0, old feature) while drafting; it now catches up on the kept drafts
  # with the target's true features.
  return follow_drafter(model, drafter, st, new, out, inputs_BxM, keep_B, draft=draft,
                        first=1 if draft is not None else 0)


def _tree_step(model, drafter: DraftModel | None, st: DecodeState, s0_B, lp0_B,
               drafts: TreeDrafts, params: SamplingParams, key, stop_ids, n: int, pad_id: int,
               *, rule: str, depth: int) -> DecodeState:
  """Verifies a tree: the root `s0` and the drafted nodes go through the target in one forward
  (tree mask, positions by depth); the accepted path is walked by `spec.verify.verify_tree`, its
  cache entries gathered into consecutive slots."""
  b = s0_B.shape[0]
  rows = jnp.arange(b)
  live_B = ~st.done_B
  tokens_BxE, valid_BxE, parents_BxE = drafts.tokens_BxE, drafts.valid_BxE, drafts.parents_BxE
  depth_BxE, mask_BxExE, q_BxExV, draft = (drafts.depth_BxE, drafts.mask_BxExE, drafts.q_BxExV,
                                           drafts.draft)
  out = model(tokens_BxE, st.cache, depth_T=depth_BxE, tree_mask_TxT=mask_BxExE,
              return_layers=needs_layers(drafter))
  logp_BxExV = processed_logprobs(out.logits_BxTxV, params, model.cfg.numerics)
  if q_BxExV is None:  # coupled and greedy walks never read q
    q_BxExV = jnp.zeros((b, tokens_BxE.shape[1], 1), jnp.float32)
  path_BxM, n_acc_B, forced_B = verify.verify_tree(
      logp_BxExV, jnp.where(valid_BxE, tokens_BxE, -1), parents_BxE, q_BxExV, key,
      st.address_BxW, st.t_B, rule=rule, greedy=params.greedy, depth=depth)
  if rule == "coupled" or params.greedy:
    forced_B = jnp.full_like(forced_B, -1)

  take = lambda x: jnp.take_along_axis(x, path_BxM.reshape(b, -1, *([1] * (x.ndim - 2))), axis=1)
  cand_BxM = take(tokens_BxE)
  # The log-prob of path node j + 1 is read from the target's distribution after node j.
  path_lp_BxM = jnp.take_along_axis(take(logp_BxExV)[:, :-1], cand_BxM[:, 1:, None], axis=2)
  cand_lp_BxM = jnp.concatenate([lp0_B[:, None], path_lp_BxM[:, :, 0]], axis=1)
  m_B = n_acc_B + 1
  path_out = dataclasses.replace(
      out, hidden_BxTxD=take(out.hidden_BxTxD),
      layers=None if out.layers is None else tuple(take(x) for x in out.layers))
  new, keep_B = emit(st, cand_BxM, cand_lp_BxM, path_out.hidden_BxTxD, m_B, stop_ids, n, pad_id)
  last_node_B = path_BxM[rows, jnp.maximum(keep_B - 1, 0)]
  new = dataclasses.replace(
      new, cache=kvc.commit(out.cache, keep_B, path_BxM),
      logits_BxV=jnp.where((keep_B > 0)[:, None], out.logits_BxTxV[rows, last_node_B],
                           st.logits_BxV),
      spec=st.spec.after_step(keep_B, m_B, forced_B, live_B))
  return follow_drafter(model, drafter, st, new, path_out, cand_BxM, keep_B, draft=draft,
                        first=1)
