"""GSPO, a learner (`rl.learner`): one importance ratio per sequence, the geometric mean of its
tokens' ratios, clipped per sequence (Group Sequence Policy Optimization). Advantages are GRPO's.

With every token's ratio at 1 its gradient equals GRPO's with sequence aggregation; where token
ratios disagree within a sequence, only their mean moves the sequence's ratio, so a sequence is
clipped as a whole or not at all.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from tlt_jax.rl.grpo import GroupRelative, kl_RxN, token_metrics


@dataclasses.dataclass(frozen=True)
class GSPOConfig(GroupRelative):
  """The GSPO learner. Its clip range is on sequence ratios, which stay close to 1: hence far
  smaller defaults than GRPO's per-token ones."""

  name: ClassVar[str] = "gspo"
  clip_low: float = 3e-4          # the sequence ratio's lower clip: 1 - clip_low
  clip_high: float = 4e-4         # its upper clip: 1 + clip_high
  kl_coef: float = 0.0            # 0 keeps no reference policy
  normalize_std: bool = True      # False: mean-centred advantages, not divided by the std

  def __post_init__(self):
    self.check()

  def loss(self, logp_RxN, old_logp_RxN, adv_R, mask_RxN, ref_logp_RxN=None,
           entropy_RxN=None) -> tuple[jax.Array, dict]:
    """The sequence-level clipped surrogate (negated), plus `kl_coef` x each sequence's mean
    token KL to the reference (k3), averaged over sequences."""
    mask = mask_RxN.astype(jnp.float32)
    len_R = jnp.maximum(mask.sum(axis=1), 1.0)
    ratio_R = jnp.exp(jnp.sum((logp_RxN - old_logp_RxN) * mask, axis=1) / len_R)
    clipped_R = jnp.clip(ratio_R, 1.0 - self.clip_low, 1.0 + self.clip_high)
    per_seq = -jnp.minimum(ratio_R * adv_R, clipped_R * adv_R)
    kl = kl_RxN(ref_logp_RxN, logp_RxN, self.kl_coef)
    loss = (per_seq + self.kl_coef * jnp.sum(kl * mask, axis=1) / len_R).mean()
    return loss, {"loss": loss,
                  "clip_fraction": jnp.mean((jnp.abs(ratio_R - clipped_R) > 1e-9)
                                            .astype(jnp.float32)),
                  "ratio_mean": ratio_R.mean(), **token_metrics(mask, kl, entropy_RxN)}

  def micro_weight(self, rows: int, tokens: float, mb_rows: int, mb_tokens: float) -> float:
    """A micro-batch's share of rows (the loss is a mean over sequences)."""
    return mb_rows / rows  # the loss is a mean over sequences
