"""Model-free suffix proposer: drafts by matching the row's latest tokens in text it has seen.

The text searched is a per-row corpus (earlier responses to the same prompt, e.g. from earlier RL
steps) followed by the row's own prompt and response so far. The longest n-gram (n <= `ngram`)
that ends the row's text and occurred before is found, latest occurrence first, and the `k`
tokens that followed it are proposed. It needs no training, so it never goes stale; drafts are
deterministic (a point mass for the rejection rule).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tlt_jax.spec.drafts import ChainDrafts, ChainProposer


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RowText:
  """The text each row searches: its context (corpus, then prompt), then its response so far
  (`tokens_BxH`, -1 past `len_B`)."""

  tokens_BxH: jax.Array
  len_B: jax.Array


class SuffixProposer(ChainProposer):
  """The `suffix` arms (`spec.proposer.Proposer`): a chain of `depth` drafts matched on up to
  `ngram` tokens."""

  name = "suffix"
  uses_draft_model = False
  reads_context = True
  fields = ("depth", "ngram")

  def start(self, context_BxH, len_B) -> RowText:
    """Each row's history: its context (corpus and prompt)."""
    return RowText(context_BxH, len_B)

  def after_emit(self, h: RowText, tokens_BxM, keep_B) -> RowText:
    """Each row's history with the emitted tokens appended."""
    b, m = tokens_BxM.shape
    j_M = jnp.arange(m)
    pos_BxM = jnp.where(j_M[None] < keep_B[:, None], h.len_B[:, None] + j_M[None],
                        h.tokens_BxH.shape[1])  # past the end: dropped
    return RowText(h.tokens_BxH.at[jnp.arange(b)[:, None], pos_BxM].set(tokens_BxM, mode="drop"),
                   h.len_B + keep_B)

  def check(self, arm) -> None:
    """Raises where the n-gram length is not positive."""
    if arm.ngram < 1:
      raise ValueError(f"A suffix arm's ngram must be >= 1, got {arm.ngram}.")

  def arm_name(self, arm) -> str:
    """`suffix_d<depth>_n<ngram>`."""
    return f"suffix_d{arm.depth}_n{arm.ngram}"

  def draft(self, target, drafter, st, s0_B, arm, params, key, rule: str, live_B) -> ChainDrafts:
    """A chain per row: the tokens that followed the latest earlier match of the row's last
    `ngram` tokens in its history."""
    rows = jnp.arange(s0_B.shape[0])
    h = st.proposers[self.name]
    hist = h.tokens_BxH.at[rows, h.len_B].set(s0_B, mode="drop")
    drafts_BxK = suffix_propose(hist, h.len_B + 1, arm.depth, arm.ngram)
    valid_BxK = jnp.cumprod((drafts_BxK >= 0).astype(jnp.int32), axis=1).astype(bool)
    return ChainDrafts(drafts_BxK, valid_BxK, None)


def suffix_propose(seq_BxL: jax.Array, len_B: jax.Array, k: int, ngram: int) -> jax.Array:
  """Drafts `[B, k]` continuing `seq[:len]` (-1 where nothing follows a match, or none is found).

  Drafts never read past `len` (positions not yet written propose -1, which never matches).
  """
  l = seq_BxL.shape[1]

  def row(seq_L, n_len):
    pos_L = jnp.arange(l)
    best_end = jnp.int32(-1)
    for n in range(1, min(ngram, l) + 1):  # longer n-grams overwrite shorter ones where found
      q = jax.lax.dynamic_slice(seq_L, (jnp.maximum(n_len - n, 0),), (n,))
      ok_L = jnp.ones((l,), bool)
      for j in range(n):
        shifted = jnp.roll(seq_L, n - j)  # shifted[e] = seq[e - n + j]
        ok_L &= shifted == q[j]
      # e: index right after the match; the match must lie in [0, len - 1) and end before the
      # query itself so that at least one known token follows it.
      ok_L &= (pos_L >= n) & (pos_L < n_len) & (n_len >= n)
      end = jnp.max(jnp.where(ok_L, pos_L, -1))
      best_end = jnp.where(end >= 0, end, best_end)
    idx_K = best_end + jnp.arange(k)
    drafts = jnp.where((best_end >= 0) & (idx_K < n_len), seq_L[jnp.clip(idx_K, 0, l - 1)], -1)
    return drafts.astype(jnp.int32)

  return jax.vmap(row)(seq_BxL, len_B)
