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

from tlt_jax.rl.grpo import GroupRelative, k3_kl


@dataclasses.dataclass(frozen=True)
class GSPOConfig(GroupRelative):
  """The GSPO learner. Its clip range is on sequence ratios, which stay close to 1: hence far
  smaller defaults than GRPO's per-token ones."""

  name: ClassVar[str] = "gspo"
  clip_low: float = 3e-4
  clip_high: float = 4e-4
  kl_coef: float = 0.0            # 0 keeps no reference policy
  normalize_std: bool = True

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
    if ref_logp_RxN is not None and self.kl_coef > 0:
      kl = k3_kl(ref_logp_RxN, logp_RxN)
      per_seq = per_seq + self.kl_coef * jnp.sum(kl * mask, axis=1) / len_R
    else:
      kl = jnp.zeros_like(mask)
    loss = per_seq.mean()
    n = jnp.maximum(mask.sum(), 1.0)
    metrics = {
        "loss": loss,
        "clip_fraction": jnp.mean((jnp.abs(ratio_R - clipped_R) > 1e-9).astype(jnp.float32)),
        "kl": jnp.sum(kl * mask) / n,
        "ratio_mean": ratio_R.mean(),
    }
    if entropy_RxN is not None:
      metrics["entropy"] = jnp.sum(entropy_RxN * mask) / n
    return loss, metrics

  def micro_weight(self, rows: int, tokens: float, mb_rows: int, mb_tokens: float) -> float:
    return mb_rows / rows  # the loss is a mean over sequences
