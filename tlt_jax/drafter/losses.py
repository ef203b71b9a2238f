"""The drafter's loss: TLT's SmoothL1 between the drafter's output and the target's next hidden
state, plus a soft cross-entropy of the drafter's distribution against the target's (both through
the target's own head, over the drafter's vocabulary, at the rollout's temperature), optionally
their total-variation distance and EAGLE-3's training-time test over several draft depths; and
the target's probability inside a restricted draft vocabulary, which bounds a draft's acceptance."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tlt_jax.drafter.model import Drafter


def smooth_l1(x, beta: float = 1.0):
  """The smooth-L1 (Huber, delta 1) distance, per position, between predicted and target
  features."""
  a = jnp.abs(x)
  return jnp.where(a < beta, 0.5 * a * a / beta, a - 0.5 * beta)


def _ahead(x_BxLx, j: int) -> jax.Array:
  """`x` at index t + j for t in [0, L - 1) (zeros past the end): a depth-j target or input."""
  return jnp.pad(x_BxLx[:, j:], [(0, 0), (0, j - 1)] + [(0, 0)] * (x_BxLx.ndim - 2))


def unroll(drafter: Drafter, emb_BxLxD, h_BxTxD, steps: int) -> list[jax.Array]:
  """The drafter's outputs at depths 1 .. `steps` from every index t < T = L - 1: depth j reads
  `embed(x_{t+j})` (from `emb_BxLxD`, the sequence's embeddings) and, at depth 1, the feature
  `h_BxTxD` at t, deeper its own output of the depth before, attending as its cache does."""
  gs, context, h = [], (), h_BxTxD
  for j in range(1, steps + 1):
    h, kv = drafter.teacher_step(_ahead(emb_BxLxD, j), h, j, context)
    context += (kv,)
    gs.append(h)
  return gs


def drafter_loss(drafter: Drafter, target, tokens_BxL, feats_BxLxF, hidden_BxLxD, mask_BxL):
  """Loss and metrics on teacher-forced sequences.

  Position t reads `embed(x_{t+1})` and the target features at t, and is scored against the
  target's final hidden state at t + 1 and the distribution it gives the token after.
  `target` supplies the frozen embedding and head (`target.embed_tokens`, `target.head`). With
  `unroll_steps` > 1, depth j at t reads `embed(x_{t+j})` and the drafter's own depth-(j - 1)
  output (`unroll`), and is scored against the target at t + j; the depths' losses are
  averaged with weights `unroll_decay ** (j - 1)` (and, with `accept_weighting`, per index by
  the chance that the depths before were accepted). Both distributions are taken at
  `label_temperature`. The metrics without a suffix are depth 1's (`total_variation`: one minus
  the rejection rule's acceptance of a depth-1 draft); `top1_agreement_d{j}` and
  `total_variation_d{j}` are depth j's.
  """
  cfg = drafter.cfg
  emb_BxLxD = jax.lax.stop_gradient(target.embed_tokens(tokens_BxL))
  h_in = drafter.project(jax.lax.stop_gradient(feats_BxLxF[:, :-1]))
  hidden_BxLxD = jax.lax.stop_gradient(hidden_BxLxD)
  # With a restricted draft vocabulary both distributions are over it (the target's renormalised).
  target_logp_BxLxR = jax.lax.stop_gradient(jax.nn.log_softmax(
      drafter.target_logits(target, hidden_BxLxD) / cfg.label_temperature, axis=-1))
  mask_BxL = mask_BxL.astype(jnp.float32)
  reach_BxT = jnp.ones_like(mask_BxL[:, :-1])  # P(depths before j accepted), accept_weighting
  total, weights, metrics = 0.0, 0.0, {}
  for j, g in enumerate(unroll(drafter, emb_BxLxD, h_in, cfg.unroll_steps), start=1):
    m = mask_BxL[:, :-1] * _ahead(mask_BxL, j)
    denom = jnp.maximum(m.sum(), 1.0)
    sl1 = jnp.sum(smooth_l1(g - _ahead(hidden_BxLxD, j)).mean(-1) * m * reach_BxT) / denom
    target_logp = _ahead(target_logp_BxLxR, j)
    draft_logits = drafter.logits(target, g)
    draft_logp = jax.nn.log_softmax(draft_logits / cfg.label_temperature, axis=-1)
    ce_BxT = -jnp.sum(jnp.exp(target_logp) * draft_logp, axis=-1)
    tv_BxT = 0.5 * jnp.sum(jnp.abs(jnp.exp(target_logp) - jnp.exp(draft_logp)), axis=-1)
    ce = jnp.sum(ce_BxT * m * reach_BxT) / denom
    tv = jnp.sum(tv_BxT * m * reach_BxT) / denom
    top1 = jnp.sum((jnp.argmax(draft_logits, -1) == jnp.argmax(target_logp, -1)) * m) / denom
    w = cfg.unroll_decay ** (j - 1)
    total = total + w * (cfg.smooth_l1_weight * sl1 + cfg.ce_weight * ce + cfg.tv_weight * tv)
    weights += w
    if cfg.accept_weighting:  # the rejection rule accepts depth j's draft with P = 1 - TV
      reach_BxT = reach_BxT * jax.lax.stop_gradient(1.0 - tv_BxT)
    if j == 1:
      metrics.update(smooth_l1=sl1, soft_ce=ce, total_variation=tv, top1_agreement=top1)
    else:
      metrics.update({f"top1_agreement_d{j}": top1, f"total_variation_d{j}": tv})
  loss = total / weights
  return loss, {"loss": loss, **metrics}


def draft_vocab_mass(drafter: Drafter, target, hidden_BxLxD, mask_BxL) -> jax.Array:
  """The probability the target (at `label_temperature`, over its whole vocabulary) puts inside
  the drafter's restricted vocabulary where depth 1 is scored, averaged over those positions. It
  bounds the acceptance of a draft from that vocabulary: the `rejection` rule accepts with
  probability sum_R min(p, q) <= sum_R p, whatever the drafter learns."""
  logp_BxLxV = jax.nn.log_softmax(
      target.head(hidden_BxLxD) / drafter.cfg.label_temperature, axis=-1)
  mass_BxT = _ahead(jnp.exp(jax.nn.logsumexp(drafter.of_vocab(logp_BxLxV), axis=-1)), 1)
  m = mask_BxL[:, :-1].astype(jnp.float32) * _ahead(mask_BxL.astype(jnp.float32), 1)
  return jnp.sum(mass_BxT * m) / jnp.maximum(m.sum(), 1.0)
