"""GRPO, one learner (`rl.learner`): group-normalised advantages, the token-level clipped
surrogate, KL and entropy; and the log-probs every learner's loss reads.

Shapes: `R` rows (responses), `G` responses per prompt (rows of one prompt are contiguous), `N`
response tokens per row with `mask_RxN` marking real ones. Log-probs are those of the processed
sampling distribution (`models.sampling.processed_logprobs`), the same quantity the rollout
recorded, so the ratio is 1 on the first epoch up to numerics.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from tlt_jax.models.sampling import SamplingParams, processed_logprobs
from tlt_jax.rl.learner import Learner


class GroupRelative(Learner):
  """What the GRPO-family learners share: advantages relative to the prompt's group, and
  non-negative clips and KL weight."""

  def advantages(self, rewards_R: jax.Array, group_size: int) -> jax.Array:
    """Each row's reward relative to its group's (divided by the group's std when
    `normalize_std`)."""
    return group_advantages(rewards_R, group_size, self.normalize_std)

  def check(self) -> None:
    """Raises on negative clips or KL weight."""
    if self.clip_low < 0 or self.clip_high < 0 or self.kl_coef < 0:
      raise ValueError("clip_low, clip_high and kl_coef must be >= 0.")


def k3_kl(ref_logp, logp) -> jax.Array:
  """k3, the low-variance unbiased estimator of KL(policy || reference) per token:
  exp(ref - logp) - (ref - logp) - 1 >= 0."""
  d = ref_logp - logp
  return jnp.exp(d) - d - 1.0


@dataclasses.dataclass(frozen=True)
class GRPOConfig(GroupRelative):
  """The GRPO learner: a per-token importance ratio, clipped per token."""

  name: ClassVar[str] = "grpo"
  clip_low: float = 0.2           # the ratio's lower clip: 1 - clip_low
  clip_high: float = 0.28         # its upper clip (clip-higher): 1 + clip_high
  kl_coef: float = 0.0            # 0 keeps no reference policy
  normalize_std: bool = True      # False: Dr.GRPO-style mean-centred advantages
  aggregation: str = "token"      # token | sequence
  max_len_norm: int = 0           # Dr.GRPO: divide token sums by this constant (0: off)

  def __post_init__(self):
    if self.aggregation not in ("token", "sequence"):
      raise ValueError(f"aggregation must be 'token' or 'sequence', got {self.aggregation!r}.")
    self.check()

  def loss(self, logp_RxN, old_logp_RxN, adv_R, mask_RxN, ref_logp_RxN=None,
           entropy_RxN=None) -> tuple[jax.Array, dict]:
    """GRPO's clipped surrogate with the KL term (`grpo_loss`)."""
    return grpo_loss(logp_RxN, old_logp_RxN, adv_R, mask_RxN, self, ref_logp_RxN, entropy_RxN)

  def micro_weight(self, rows: int, tokens: float, mb_rows: int, mb_tokens: float) -> float:
    """A micro-batch's share of the batch's loss: rows for sequence aggregation, tokens for
    token aggregation, 1 for a constant denominator."""
    if self.aggregation == "sequence":
      return mb_rows / rows                 # the mean over rows
    if self.max_len_norm:
      return 1.0                            # a sum over tokens / a constant
    return max(mb_tokens, 1.0) / tokens     # the mean over all tokens


def group_advantages(rewards_R: jax.Array, group_size: int, normalize_std: bool = True,
                     eps: float = 1e-6) -> jax.Array:
  """Reward minus its group's mean, divided by the group's std when `normalize_std`."""
  r = rewards_R.reshape(-1, group_size)
  adv = r - r.mean(axis=1, keepdims=True)
  if normalize_std:
    adv = adv / (r.std(axis=1, keepdims=True) + eps)
  return adv.reshape(-1)


def token_logprobs(model, tokens_RxL: jax.Array, prompt_len_R: jax.Array, n: int,
                   params: SamplingParams, remat: str = "none") -> tuple[jax.Array, jax.Array]:
  """Log-probs `[R, N]` of the response tokens under the processed distribution, and the
  per-token entropy of that distribution. Row r's response starts at `prompt_len_R[r]`;
  `remat`: what the backward pass keeps of each layer (`transformer.REMAT_POLICIES`)."""
  logits = model(tokens_RxL[:, :-1], remat=remat).logits_BxTxV
  logp_all = processed_logprobs(logits, params, model.cfg.numerics)
  idx_RxN = prompt_len_R[:, None] - 1 + jnp.arange(n)[None, :]
  idx_RxN = jnp.clip(idx_RxN, 0, logits.shape[1] - 1)
  logp_RxNxV = jnp.take_along_axis(logp_all, idx_RxN[:, :, None], axis=1)
  targets_RxN = jnp.take_along_axis(tokens_RxL, idx_RxN + 1, axis=1)
  lp = jnp.take_along_axis(logp_RxNxV, targets_RxN[:, :, None], axis=2)[:, :, 0]
  p = jnp.exp(logp_RxNxV)
  ent = -jnp.sum(jnp.where(p > 0, p * logp_RxNxV, 0.0), axis=-1)
  return lp, ent


def grpo_loss(logp_RxN, old_logp_RxN, adv_R, mask_RxN, cfg: GRPOConfig,
              ref_logp_RxN=None, entropy_RxN=None) -> tuple[jax.Array, dict]:
  """The clipped surrogate (negated, to minimise), plus `kl_coef` x KL(policy || reference)."""
  mask = mask_RxN.astype(jnp.float32)
  ratio = jnp.exp(logp_RxN - old_logp_RxN)
  adv = adv_R[:, None]
  clipped = jnp.clip(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
  per_tok = -jnp.minimum(ratio * adv, clipped * adv)
  kl = kl_RxN(ref_logp_RxN, logp_RxN, cfg.kl_coef)
  per_tok = per_tok + cfg.kl_coef * kl
  if cfg.aggregation == "token":
    denom = cfg.max_len_norm if cfg.max_len_norm else jnp.maximum(mask.sum(), 1.0)
    loss = jnp.sum(per_tok * mask) / denom
  else:
    per_seq = jnp.sum(per_tok * mask, axis=1) / jnp.maximum(mask.sum(axis=1), 1.0)
    loss = per_seq.mean()
  n = jnp.maximum(mask.sum(), 1.0)
  return loss, {"loss": loss,
                "clip_fraction": jnp.sum((jnp.abs(ratio - clipped) > 1e-6) * mask) / n,
                "ratio_mean": jnp.sum(ratio * mask) / n, **token_metrics(mask, kl, entropy_RxN)}


def kl_RxN(ref_logp_RxN, logp_RxN, kl_coef: float) -> jax.Array:
  """The per-token KL estimate to the reference (k3); zeros when the term is off."""
  if ref_logp_RxN is None or kl_coef <= 0:
    return jnp.zeros_like(logp_RxN)
  return k3_kl(ref_logp_RxN, logp_RxN)


def token_metrics(mask_RxN, kl_RxN_, entropy_RxN=None) -> dict:
  """The token means every learner reports beside its own: `kl` and, when given, `entropy`."""
  n = jnp.maximum(mask_RxN.sum(), 1.0)
  out = {"kl": jnp.sum(kl_RxN_ * mask_RxN) / n}
  if entropy_RxN is not None:
    out["entropy"] = jnp.sum(entropy_RxN * mask_RxN) / n
  return out
