"""Replay: a row's stored response (`rollout/history.py`) re-verified `chunk` tokens at a time.

Under prompt-addressed noise (`rollout/noise.py`) and the `coupled` rule, a row's stored response
is what an earlier policy sampled under the noise this row sees now. The replay step is a
speculative chain step whose drafts are the stored tokens after the row's next token: one target
forward checks `chunk` of them, the prefix equal to the current policy's Gumbel-max samples is
kept, and at the first difference the policy's own sample is emitted, as in every coupled step.
Every emitted token is therefore the one plain decoding under the same noise emits: replay only
changes how many forwards it takes.

A row replays while everything it emitted equals its stored response (`ReplayState.on_B`, kept
by `emit` whatever step ran); from its first difference it decodes as any other row. Hidden
states of replayed tokens come from the verify forward (captured by `emit`), so the lazy drafter
and the adaptive drafter's buffer see them as they see any other token.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tlt_jax.spec.drafts import ChainDrafts


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ReplayState:
  """Each row's stored response (`[B, N]`; `[B, 0]` when replay is off) and its length, whether
  the row still replays, and the tokens replay steps emitted for it while it did."""

  tokens_BxN: jax.Array
  len_B: jax.Array
  on_B: jax.Array
  emitted_B: jax.Array

  @classmethod
  def empty(cls, b: int, n: int) -> ReplayState:
    """`b` rows with nothing stored (`n`: the stored width; 0 when replay is off)."""
    return cls(jnp.zeros((b, n), jnp.int32), jnp.zeros((b,), jnp.int32),
               jnp.zeros((b,), bool), jnp.zeros((b,), jnp.int32))

  @classmethod
  def start(cls, tokens_BxN: jax.Array, len_B: jax.Array) -> ReplayState:
    """Rows about to decode their first token, with their stored responses (length 0: none)."""
    return cls(tokens_BxN, len_B, len_B > 0, jnp.zeros_like(len_B))

  def after_emit(self, tokens_BxN: jax.Array, t_old_B: jax.Array,
                 t_new_B: jax.Array) -> ReplayState:
    """After the rows' responses grew from `t_old_B` to `t_new_B` tokens (`tokens_BxN`): a row
    still replays while every token equals the stored one and the stored response goes on."""
    if not self.tokens_BxN.shape[1]:
      return self
    pos_N = jnp.arange(self.tokens_BxN.shape[1])
    new_BxN = (pos_N[None] >= t_old_B[:, None]) & (pos_N[None] < t_new_B[:, None])
    same_B = jnp.all((tokens_BxN == self.tokens_BxN) | ~new_BxN, axis=1)
    return dataclasses.replace(self, on_B=self.on_B & same_B & (t_new_B < self.len_B))


def replay_drafts(st, s0_B: jax.Array, chunk: int) -> ChainDrafts:
  """The stored tokens after each replaying row's next token `s0` (`chunk` of them, fewer where
  the stored response ends); none for a row that no longer replays or whose `s0` differs."""
  rp = st.replay
  pos_BxK = st.t_B[:, None] + 1 + jnp.arange(chunk)[None]
  width = rp.tokens_BxN.shape[1]
  tokens_BxK = jnp.take_along_axis(rp.tokens_BxN, jnp.minimum(pos_BxK, width - 1), axis=1)
  s0_stored_B = jnp.take_along_axis(rp.tokens_BxN, jnp.minimum(st.t_B, width - 1)[:, None],
                                    axis=1)[:, 0]
  on_B = rp.on_B & ~st.done_B & (s0_B == s0_stored_B)
  return ChainDrafts(tokens_BxK, on_B[:, None] & (pos_BxK < rp.len_B[:, None]), None)
