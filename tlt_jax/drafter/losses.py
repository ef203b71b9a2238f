"""TLT's drafter loss: SmoothL1 between the drafter's output and the target's next hidden state,
plus a soft cross-entropy of the drafter's logits against the target's next-token distribution
(both through the target's own head, over the drafter's vocabulary)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tlt_jax.drafter.model import Drafter


def smooth_l1(x, beta: float = 1.0):
  a = jnp.abs(x)
  return jnp.where(a < beta, 0.5 * a * a / beta, a - 0.5 * beta)


def drafter_loss(drafter: Drafter, target, tokens_BxL, feats_BxLxF, hidden_BxLxD, mask_BxL):
  """Loss and metrics on teacher-forced sequences.

  Position t reads `embed(x_{t+1})` and the target features at t, and is scored against the
  target's final hidden state at t + 1 and the distribution it gives the token after.
  `target` supplies the frozen embedding and head (`target.embed`, `target.head`).
  """
  emb = jax.lax.stop_gradient(target.embed(tokens_BxL[:, 1:]))
  h_in = drafter.project(jax.lax.stop_gradient(feats_BxLxF[:, :-1]))
  g, _ = drafter(emb, h_in)
  want = jax.lax.stop_gradient(hidden_BxLxD[:, 1:])
  m = (mask_BxL[:, 1:] * mask_BxL[:, :-1]).astype(jnp.float32)
  denom = jnp.maximum(m.sum(), 1.0)
  sl1 = jnp.sum(smooth_l1(g - want).mean(-1) * m) / denom
  # With a restricted draft vocabulary both distributions are over it (the target's renormalised).
  target_logp = jax.lax.stop_gradient(jax.nn.log_softmax(drafter.logits(target, want), axis=-1))
  draft_logits = drafter.logits(target, g)
  draft_logp = jax.nn.log_softmax(draft_logits, axis=-1)
  ce = jnp.sum(-jnp.sum(jnp.exp(target_logp) * draft_logp, axis=-1) * m) / denom
  top1 = jnp.sum((jnp.argmax(draft_logits, -1) == jnp.argmax(target_logp, -1)) * m) / denom
  cfg = drafter.cfg
  loss = cfg.smooth_l1_weight * sl1 + cfg.ce_weight * ce
  return loss, {"loss": loss, "smooth_l1": sl1, "soft_ce": ce, "top1_agreement": top1}
