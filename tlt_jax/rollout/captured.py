"""The hidden states a rollout captured for the drafter, left on the devices that decoded them.

When a shard harvests finished rows, the captured hidden states of its state are copied on the
device (a buffer copy: no program, no host transfer), because the next dispatch reuses the
state's buffers; a wave's last harvest keeps them as they are (nothing reuses them). Each copy is
a `Piece` that says which of its slots hold which of the call's rows. The drafter's buffer reads
the pieces on the device (`tlt_jax.drafter.buffer.DataBuffer.add_rollout`), so hidden states
reach the host only when someone asks (`to_host`: inspection and tests).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class Piece:
  """The captured hidden states of one shard's batch at one harvest (in the compute dtype)."""

  hidden_BxNxD: jax.Array       # of each emitted token
  prompt_hidden_BxD: jax.Array  # of the last prompt token (it predicted the first response token)
  slots: np.ndarray             # the slots harvested here
  rows: np.ndarray              # the call's row each of those slots holds


@dataclasses.dataclass
class CapturedHidden:
  """A call's captured hidden states: `rows` rows of up to `n` tokens, as device pieces."""

  rows: int
  n: int
  d_model: int
  dtype: np.dtype
  pieces: list[Piece] = dataclasses.field(default_factory=list)

  def harvest(self, hidden_BxNxD: jax.Array, prompt_hidden_BxD: jax.Array, slots: np.ndarray,
              rows: np.ndarray, last: bool) -> None:
    """Keeps the given slots' hidden states; `last`: the state is not dispatched again."""
    if not len(slots):
      return
    if not last:
      hidden_BxNxD, prompt_hidden_BxD = (jax.device_put(x, x.sharding, may_alias=False)
                                         for x in (hidden_BxNxD, prompt_hidden_BxD))
    self.pieces.append(Piece(hidden_BxNxD, prompt_hidden_BxD, np.asarray(slots),
                             np.asarray(rows)))

  def to_host(self) -> tuple[np.ndarray, np.ndarray]:
    """(hidden `[R, N, D]`, prompt hidden `[R, D]`) on the host, in the compute dtype."""
    hidden = np.zeros((self.rows, self.n, self.d_model), self.dtype)
    prompt = np.zeros((self.rows, self.d_model), self.dtype)
    for p in self.pieces:
      h, ph = jax.device_get((p.hidden_BxNxD, p.prompt_hidden_BxD))
      hidden[p.rows], prompt[p.rows] = h[p.slots], ph[p.slots]
    return hidden, prompt
