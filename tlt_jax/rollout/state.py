"""The decode state of one shard, and the plain (one token per row) decode step.

Invariant shared by plain and speculative steps: every token a row has emitted has been fed to the
model and committed to its cache, and `logits_BxV` are the logits after the last of them, so the
next token is sampled from `logits_BxV` with the noise of its own position. A speculative step that
ends on a rejection leaves that position's token in `spec.pending_B` (forced next, -1 when none).
Either step can follow the other without flushing or re-prefilling.

`DecodeState` is the base state plain decoding needs, plus one part per concern above it: `spec`
(what speculative steps leave for the next step, and their counts), `proposers` (the per-row
state of each proposer that keeps one, by name, which `emit` hands what each row emitted),
`captured` (hidden states the draft model follows lazily and trains on), `replay` (each row's
stored response, `rollout/replay.py`) and `draft` (the draft model's own state,
`spec.proposer.DraftModel`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from tlt_jax.models import kv_cache as kvc
from tlt_jax.models.bits import update_as_bits
from tlt_jax.models.sampling import SamplingParams, processed_logprobs, sample_from_logprobs
from tlt_jax.rollout.replay import ReplayState
from tlt_jax.spec.proposer import DraftModel, Proposer, get_proposer


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SpecState:
  """What speculative steps add to a row: the token the rejection rule forces next (-1: none),
  and the speculative steps the row took while live and the tokens they emitted."""

  pending_B: jax.Array
  steps_B: jax.Array
  tokens_B: jax.Array

  def after_step(self, keep_B, m_B, forced_B, live_B) -> SpecState:
    """After a speculative step that kept `keep_B` of `m_B` candidates (`forced_B`: the token a
    rejection forces next, -1 when none)."""
    return SpecState(
        pending_B=jnp.where((keep_B > 0) & (keep_B == m_B), forced_B,
                            jnp.where(keep_B > 0, -1, self.pending_B)),
        steps_B=self.steps_B + live_B, tokens_B=self.tokens_B + keep_B)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Captured:
  """Hidden states the draft model follows lazily and trains on: of each emitted token
  (`[B, 0, D]` when not captured) and of the last prompt token (it predicted token 0)."""

  hidden_BxNxD: jax.Array
  prompt_hidden_BxD: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
  """Everything one shard's decode loop carries, batch-leading: compacted as one pytree."""

  cache: kvc.KVCache
  logits_BxV: jax.Array       # next-token logits of each row
  address_BxW: jax.Array      # the row's noise address (`rollout/noise.py`)
  t_B: jax.Array              # tokens emitted so far
  done_B: jax.Array
  stopped_B: jax.Array        # ended on a stop token (else: length)
  tokens_BxN: jax.Array
  logprobs_BxN: jax.Array
  spec: SpecState
  proposers: dict[str, Any]   # each context-reading proposer's per-row state, by name
  captured: Captured
  replay: ReplayState
  draft: Any = None           # the draft model's per-row state (`spec.proposer`), if any


def empty_state(cfg, b: int, layout, pad_id: int, drafter: DraftModel | None = None,
                proposers: tuple[Proposer, ...] = (), attention: str = "xla",
                cache_dtype: str = "") -> DecodeState:
  """A state of `b` done rows in `layout` (`rollout.programs.Layout`), with the draft model's
  state when there is one and that of each of `proposers` (from an empty context), its caches
  laid out for the `attention` implementation, the policy's in `cache_dtype` (empty: the compute
  dtype)."""
  cache_len, n, capture = layout.cache_len, layout.n, layout.capture
  i32 = lambda: jnp.zeros((b,), jnp.int32)
  context_BxH = jnp.full((b, layout.ctx_len), -1, jnp.int32)
  return DecodeState(
      draft=drafter.init_state(cfg, b, cache_len, attention) if drafter is not None else None,
      cache=kvc.init_cache(cfg, b, cache_len, cache_dtype or None, attention),
      logits_BxV=jnp.zeros((b, cfg.vocab_size)),
      address_BxW=jnp.zeros((b, layout.words), jnp.int32), t_B=i32(),
      done_B=jnp.ones((b,), bool), stopped_B=jnp.zeros((b,), bool),
      tokens_BxN=jnp.full((b, n), pad_id, jnp.int32), logprobs_BxN=jnp.zeros((b, n), jnp.float32),
      spec=SpecState(pending_B=jnp.full((b,), -1, jnp.int32), steps_B=i32(), tokens_B=i32()),
      proposers={p.name: p.start(context_BxH, i32()) for p in proposers},
      captured=Captured(
          jnp.zeros((b, n if capture else 0, cfg.d_model), jnp.dtype(cfg.dtype)),
          jnp.zeros((b, cfg.d_model), jnp.dtype(cfg.dtype))),
      replay=ReplayState.empty(b, n if layout.replay else 0))


def next_token(st: DecodeState, params: SamplingParams, key,
               numerics: str) -> tuple[jax.Array, jax.Array]:
  """The row's next token (pending, else sampled at its own position) and its log-prob, under
  the target's `numerics`."""
  logp_BxV = processed_logprobs(st.logits_BxV, params, numerics)
  sampled = sample_from_logprobs(logp_BxV, params, key, st.address_BxW, st.t_B)
  tok_B = jnp.where(st.spec.pending_B >= 0, st.spec.pending_B, sampled)
  return tok_B, jnp.take_along_axis(logp_BxV, tok_B[:, None], axis=1)[:, 0]


def emit(st: DecodeState, toks_BxM, logps_BxM, hidden_BxMxD, m_B, stop_ids, n: int,
         pad_id: int) -> tuple[DecodeState, jax.Array]:
  """Appends the first `m_B` of M candidate tokens per row, cut at a stop token or max length.

  Returns the new state (cache, logits and pending untouched) and the kept count per row.
  """
  b, mm = toks_BxM.shape
  live_B = ~st.done_B
  j_M = jnp.arange(mm)
  is_stop_BxM = jnp.isin(toks_BxM, stop_ids)
  cand_BxM = (j_M[None] < m_B[:, None]) & live_B[:, None]
  first_stop_B = jnp.min(jnp.where(is_stop_BxM & cand_BxM, j_M[None], mm), axis=1)
  keep_B = jnp.minimum(jnp.minimum(m_B, first_stop_B + 1), n - st.t_B)
  keep_B = jnp.where(live_B, keep_B, 0)
  keep_BxM = j_M[None] < keep_B[:, None]
  rows = jnp.arange(b)[:, None]
  pos_BxM = jnp.where(keep_BxM, st.t_B[:, None] + j_M[None], n)  # n: out of range, dropped
  tokens = st.tokens_BxN.at[rows, pos_BxM].set(toks_BxM, mode="drop")
  logprobs = st.logprobs_BxN.at[rows, pos_BxM].set(logps_BxM, mode="drop")
  hidden = st.captured.hidden_BxNxD
  if hidden.shape[1]:
    hidden = update_as_bits(lambda h, v: h.at[rows, pos_BxM].set(v, mode="drop"), hidden,
                            hidden_BxMxD)
  proposers = {name: get_proposer(name).after_emit(part, toks_BxM, keep_B)
               for name, part in st.proposers.items()}
  t_B = st.t_B + keep_B
  hit_stop_B = live_B & (first_stop_B < keep_B)
  done_B = st.done_B | hit_stop_B | (t_B >= n)
  return dataclasses.replace(
      st, tokens_BxN=tokens, logprobs_BxN=logprobs, proposers=proposers, t_B=t_B, done_B=done_B,
      captured=dataclasses.replace(st.captured, hidden_BxNxD=hidden),
      replay=st.replay.after_emit(tokens, st.t_B, t_B),
      stopped_B=st.stopped_B | hit_stop_B), keep_B


def follow_drafter(model, drafter: DraftModel | None, old: DecodeState, new: DecodeState, out,
                   inputs_BxT, keep_B, draft=None, first: int = 0) -> DecodeState:
  """Keeps the draft model in step after a target forward over `inputs_BxT` of which `keep_B`
  were kept (`draft`: its state after drafting, when the step drafted)."""
  if drafter is None:
    return new
  draft = old.draft if draft is None else draft
  return dataclasses.replace(new, draft=drafter.follow(model, draft, out, inputs_BxT, keep_B,
                                                       new.t_B, first))


def needs_layers(drafter: DraftModel | None) -> bool:
  """Whether the target must return its intermediate layers for `drafter`."""
  return drafter is not None and drafter.needs_layers


def plain_step(model, drafter, st: DecodeState, params: SamplingParams, key, stop_ids, n: int,
               pad_id: int, follow: bool = True) -> DecodeState:
  """One token per live row: sample, record, feed, commit (and keep the drafter in step, unless
  `follow` is off: lazy following, where `DraftModel.catch_up` feeds it when it is needed)."""
  live_B = ~st.done_B
  tok_B, lp_B = next_token(st, params, key, model.cfg.numerics)
  tok_B = jnp.where(live_B, tok_B, pad_id)
  out = model(tok_B[:, None], st.cache, return_layers=needs_layers(drafter))
  new, keep_B = emit(st, tok_B[:, None], lp_B[:, None], out.hidden_BxTxD, jnp.ones_like(st.t_B),
                     stop_ids, n, pad_id)
  new = dataclasses.replace(
      new, cache=kvc.commit(out.cache, keep_B),
      logits_BxV=jnp.where((keep_B > 0)[:, None], out.logits_BxTxV[:, 0], st.logits_BxV),
      spec=dataclasses.replace(st.spec, pending_B=jnp.where(keep_B > 0, -1, st.spec.pending_B)))
  if not follow:
    return new
  return follow_drafter(model, drafter, st, new, out, tok_B[:, None], keep_B)
