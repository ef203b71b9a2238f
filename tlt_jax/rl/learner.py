"""What an RL algorithm contributes to a step: the learner interface, with its hooks.

The loop (`trainer.py`) runs the same stages for every algorithm (sample, score, select,
advantages, update, sync, drafter, record) and asks the learner at each point where algorithms
differ: how a response's task reward is shaped (`shape_rewards`), which prompt groups a step keeps
and how many top-up rounds it may draw to replace the rest (`keep_groups`, `max_rounds`), the
advantages, the loss, and the weight of a micro-batch's loss in the batch's. A new learner is a
frozen dataclass subclassing `Learner` (its fields are its settings, `rl.<name>` in a config),
added to `rl/learners.py`.
"""

from __future__ import annotations

from typing import ClassVar

import jax
import numpy as np


class Learner:
  """The interface; the hooks' defaults keep every group and leave rewards as the task gives
  them (GRPO, GSPO)."""

  name: ClassVar[str]
  kl_coef: float = 0.0        # > 0: the update keeps a frozen reference policy
  max_rounds: int = 0         # top-up rounds a step may draw to replace groups it did not keep

  def shape_rewards(self, rewards_R: np.ndarray, lengths_R: np.ndarray,
                    max_new_tokens: int) -> np.ndarray:
    """The rewards the advantages are computed from, given the task's and the responses'
    lengths (in tokens, of at most `max_new_tokens`)."""
    del lengths_R, max_new_tokens
    return rewards_R

  def keep_groups(self, rewards_PxG: np.ndarray) -> np.ndarray:
    """`[P]` bool: the prompt groups (by their task rewards) the update learns from."""
    return np.ones(rewards_PxG.shape[0], bool)

  def advantages(self, rewards_R: jax.Array, group_size: int) -> jax.Array:
    """One advantage per row."""
    raise NotImplementedError

  def loss(self, logp_RxN, old_logp_RxN, adv_R, mask_RxN, ref_logp_RxN=None,
           entropy_RxN=None) -> tuple[jax.Array, dict]:
    """The loss to minimise and its metrics (`loss`, `clip_fraction`, `kl`, `ratio_mean`, ...)."""
    raise NotImplementedError

  def micro_weight(self, rows: int, tokens: float, mb_rows: int, mb_tokens: float) -> float:
    """The weight of a micro-batch's loss (`mb_rows` rows, `mb_tokens` response tokens) such that
    the weighted sum over micro-batches is the full batch's (`rows`, `tokens`) loss."""
    raise NotImplementedError
