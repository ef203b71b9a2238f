"""The one optimizer builder of the policy's SFT, its RL update and the drafter: AdamW after
global-norm clipping, on a linear warm-up that either decays (cosine) to a fixed end or holds."""

from __future__ import annotations

import optax


def adamw(lr: float, *, warmup_steps: int, total_steps: int | None = None,
          end_lr_fraction: float = 0.1, b1: float = 0.9, b2: float = 0.999,
          weight_decay: float = 0.0, clip: float = 1.0) -> optax.GradientTransformation:
  """With `total_steps`: warm-up (at most `total_steps - 1` steps), then cosine decay to
  `end_lr_fraction * lr` at `total_steps`. Without (a trainer with no fixed end, the drafter's):
  warm-up, then `lr` from there on."""
  if total_steps is None:
    schedule = (optax.linear_schedule(0.0, lr, warmup_steps) if warmup_steps
                else optax.constant_schedule(lr))
  else:
    warmup = min(warmup_steps, max(total_steps - 1, 0))
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(total_steps, warmup + 1),
                                                  lr * end_lr_fraction)
  return optax.chain(optax.clip_by_global_norm(clip),
                     optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay))
