"""What an RL algorithm contributes to a step, behind one interface, and the learners by name.

The loop (`trainer.py`) and the sharded update (`update.py`) are the same for every learner: a
learner turns a step's rewards into advantages, scores the policy's log-probs against the
behaviour policy's (and a frozen reference's, when `kl_coef` > 0), and says how much of the full
batch's loss one micro-batch carries. A new learner is one file with these methods, added to
`LEARNERS`; a config picks it with `rl.learner = "<name>"` and its settings in `rl.<name>`.
"""

from __future__ import annotations

from typing import Protocol

import jax

from tlt_jax.errors import ConfigError
from tlt_jax.rl.grpo import GRPOConfig
from tlt_jax.rl.gspo import GSPOConfig
from tlt_jax.typed import typed


class Learner(Protocol):
  name: str
  kl_coef: float  # > 0: the update keeps a frozen reference policy

  def advantages(self, rewards_R: jax.Array, group_size: int) -> jax.Array:
    """One advantage per row; rows of a prompt are contiguous, `group_size` of them."""

  def loss(self, logp_RxN, old_logp_RxN, adv_R, mask_RxN, ref_logp_RxN=None,
           entropy_RxN=None) -> tuple[jax.Array, dict]:
    """The loss to minimise and its metrics (`loss`, `clip_fraction`, `kl`, `ratio_mean`, ...)."""

  def micro_weight(self, rows: int, tokens: float, mb_rows: int, mb_tokens: float) -> float:
    """The weight of a micro-batch's loss (`mb_rows` rows, `mb_tokens` response tokens) such that
    the weighted sum over micro-batches is the full batch's (`rows`, `tokens`) loss."""


LEARNERS = {cls.name: cls for cls in (GRPOConfig, GSPOConfig)}


def learner_from_section(rl) -> Learner:
  """The learner a run config's `rl` section names (`rl.learner`, default "grpo"), built from its
  settings (`rl.<name>`)."""
  name = rl.get("learner", "grpo")
  if name not in LEARNERS:
    raise ConfigError(f"config.rl.learner={name!r} is not a learner; available: "
                      f"{', '.join(sorted(LEARNERS))}.")
  if name not in rl:
    raise ConfigError(f"config.rl.learner={name!r} needs a config.rl.{name} section (its "
                      f"settings; an empty one takes {LEARNERS[name].__name__}'s defaults).")
  return typed(LEARNERS[name], rl[name], f"rl.{name}")
