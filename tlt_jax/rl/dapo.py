"""DAPO, a learner (`rl.learner = "dapo"`): GRPO's clip-higher and token-level loss, plus dynamic
sampling and the soft overlong penalty (Decoupled Clip and Dynamic sAmpling Policy Optimization).

Dynamic sampling: a group whose task rewards are all equal has zero advantage and teaches
nothing, so the step drops it and draws top-up rounds of prompts from the pool (at most
`max_rounds`, each the shape of the step's own rollout, addressed by step and round so a resumed
run draws what a straight one does) until the batch holds `prompts_per_step` groups with mixed
rewards. When the rounds run out first, the step goes on with the groups it has; the remaining
slots hold dropped groups whose tokens are masked out, so the update's shapes never change.

Soft overlong penalty: a response longer than `max_new_tokens - overlong_buffer` tokens loses up
to `overlong_penalty`, linearly over the buffer's last tokens (0: off).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from tlt_jax.rl.grpo import GRPOConfig


@dataclasses.dataclass(frozen=True)
class DAPOConfig(GRPOConfig):
  """The DAPO learner: GRPO's loss with token aggregation and clip-higher, dynamic sampling
  (`max_rounds` top-up rounds per step) and the soft overlong penalty."""

  name: ClassVar[str] = "dapo"
  max_rounds: int = 2             # top-up rounds per step (0: drop groups, draw none)
  overlong_buffer: int = 0        # the last tokens before max_new_tokens that are penalised
  overlong_penalty: float = 1.0   # the penalty at max_new_tokens

  def __post_init__(self):
    super().__post_init__()
    if self.max_rounds < 0 or self.overlong_buffer < 0 or self.overlong_penalty < 0:
      raise ValueError("max_rounds, overlong_buffer and overlong_penalty must be >= 0.")

  def keep_groups(self, rewards_PxG: np.ndarray) -> np.ndarray:
    """The groups whose task rewards are not all equal (the others have zero advantage)."""
    return rewards_PxG.max(axis=1) > rewards_PxG.min(axis=1)

  def shape_rewards(self, rewards_R: np.ndarray, lengths_R: np.ndarray,
                    max_new_tokens: int) -> np.ndarray:
    """The task's rewards plus the soft overlong penalty."""
    return rewards_R + overlong_penalty(lengths_R, max_new_tokens, self.overlong_buffer,
                                        self.overlong_penalty)


def overlong_penalty(lengths_R: np.ndarray, max_len: int, buffer: int,
                     penalty: float) -> np.ndarray:
  """0 up to `max_len - buffer` tokens, then falling linearly to `-penalty` at `max_len`."""
  if buffer <= 0:
    return np.zeros(np.shape(lengths_R), np.float32)
  over = np.asarray(lengths_R, np.float32) - (max_len - buffer)
  return (-penalty * np.clip(over, 0.0, buffer) / buffer).astype(np.float32)
