"""What each rollout shard is doing during one `generate` call, and which shard to serve next.

The engine dispatches every busy shard's next steps without waiting, then serves shards in the
order their dispatches complete (`next_ready` polls the arrays instead of blocking on one shard
in turn): a shard that finishes early is harvested, compacted or handed its next wave while the
others still run.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from tlt_jax.rollout.captured import CapturedHidden
from tlt_jax.rollout.state import DecodeState

_POLL_S = 1e-4


@dataclasses.dataclass
class ShardRun:
  """A busy shard's wave: its decode state on the device and the host's view of its rows."""

  state: DecodeState
  b: int                   # batch bucket
  slots: np.ndarray        # the row of each slot (-1: padding)
  live: int                # live rows
  t: np.ndarray            # tokens each slot had emitted at the last sync
  ss: np.ndarray           # speculative steps each slot had taken at the last sync
  arm: int | None = None   # the arm of the dispatch in flight (None: plain or replay)
  t0: float = 0.0          # when it was launched
  kind: str = "decode"     # what the dispatch in flight runs: decode, spec:<arm> or replay
  replaying: np.ndarray | None = None  # which slots' live rows still replay their stored responses
  replayed: np.ndarray | None = None  # tokens each slot had emitted by replay at the last sync
  # Whether a lazily-following draft model has read every emitted token (after a speculative
  # dispatch that drafted with it); why the dispatch in flight is not the arm's steady speed:
  # "catch_up" (it first feeds a lazy drafter the plain steps' tokens), "compiling" (background
  # compiles share the host with it), or "" (neither).
  drafter_current: bool = False
  apart: str = ""


def next_ready(runs: dict[int, ShardRun]) -> int:
  """The shard (a key of `runs`) whose dispatch in flight completes first; with one shard, that
  shard (the caller then blocks on it)."""
  if len(runs) == 1:
    return next(iter(runs))
  while True:
    for s, run in runs.items():
      if run.state.done_B.is_ready():
        return s
    time.sleep(_POLL_S)


class Results:
  """Host buffers for a call's `R` rows of up to `N` new tokens, filled as shards finish rows;
  captured hidden states (`hidden`) stay on the devices, in `hidden_dtype` (the model's compute
  dtype), until the drafter reads them."""

  def __init__(self, rows: int, n: int, d_model: int, pad_id: int, hidden: bool,
               hidden_dtype="float32"):
    self.tokens_RxN = np.full((rows, n), pad_id, np.int32)
    self.logprobs_RxN = np.zeros((rows, n), np.float32)
    self.lengths_R = np.zeros(rows, np.int32)
    self.stopped_R = np.zeros(rows, bool)
    self.hidden = (CapturedHidden(rows, n, d_model, jnp.dtype(hidden_dtype)) if hidden
                   else None)

  def harvest(self, st: DecodeState, slots: np.ndarray, rows: np.ndarray, last: bool) -> None:
    """Copies the given slots of a shard's state into their rows (`last`: the state is not
    dispatched again)."""
    host = jax.device_get((st.tokens_BxN, st.logprobs_BxN, st.t_B, st.stopped_B))
    for slot, r in zip(slots, rows):
      self.tokens_RxN[r], self.logprobs_RxN[r] = host[0][slot], host[1][slot]
      self.lengths_R[r], self.stopped_R[r] = host[2][slot], host[3][slot]
    if self.hidden is not None:
      self.hidden.harvest(st.captured.hidden_BxNxD, st.captured.prompt_hidden_BxD, slots, rows,
                          last)


def split_waves(cfg, total: int) -> list[list[np.ndarray]]:
  """Rows of each shard's waves: the `cfg.num_shards` shards take contiguous blocks of the
  `total` rows, and each shard processes its block in waves of at most `cfg.max_batch` rows."""
  blocks = np.array_split(np.arange(total), cfg.num_shards)
  return [[blk[i: i + cfg.max_batch] for i in range(0, len(blk), cfg.max_batch)]
          for blk in blocks]
