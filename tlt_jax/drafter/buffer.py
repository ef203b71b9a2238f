"""The drafter's training data, captured from rollouts: bounded, recency-aware, tail-favouring.

A rollout run with `capture_hidden=True` yields, for every row, the target's final hidden state at
the last prompt position and at every emitted response token (plain and speculative steps alike).
Each row becomes one `Segment`: tokens `[p_last, r_0, ..., r_{n-1}]` and hidden states at those
positions, tagged with the policy version and RL step that produced them. The drafter learns, at
position t, to map (embed(token t+1), hidden t) to hidden t+1 and the target's next-token
distribution, which is exactly what a segment holds: no second target forward is needed.

Hidden states keep the target's compute dtype (bf16: half of float32's bytes). Memory is bounded
by `max_tokens` (bytes: max_tokens x D x 4 for float32 hidden states, x 2 for bf16, plus the
tokens): when full, the oldest RL step's segments go first. Sampling favours what the rollout's
tail is made of: a segment is drawn with probability proportional to length ** `length_power`
(long responses dominate the tail's time) times 0.5 ** (age in RL steps / `half_life`).
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Segment:
  tokens_L: np.ndarray        # [L] int32: the last prompt token, then the response
  hidden_LxD: np.ndarray      # [L, D]: the target's final hidden state at each of those positions
                              # (in its compute dtype)
  version: int                # policy version: updates applied to the weights that sampled it
  step: int                   # RL step of the rollout

  @property
  def length(self) -> int:
    return int(self.tokens_L.shape[0])


@dataclasses.dataclass(frozen=True)
class BufferConfig:
  max_tokens: int = 200_000   # capacity in segment tokens (tiny: ~150 MB of float32 hidden states)
  length_power: float = 1.0   # sampling weight ~ length ** length_power
  half_life: float = 4.0      # sampling weight halves every `half_life` RL steps of age
  min_length: int = 2         # shorter segments hold no training pair

  def __post_init__(self):
    if self.max_tokens < 1 or self.half_life <= 0 or self.length_power < 0:
      raise ValueError(f"BufferConfig needs max_tokens >= 1, half_life > 0, length_power >= 0; "
                       f"got {self}.")


class DataBuffer:
  """Segments from recent rollouts, at most `max_tokens` tokens in all."""

  def __init__(self, cfg: BufferConfig = BufferConfig(), seed: int = 0):
    self.cfg = cfg
    self._segments: collections.deque[Segment] = collections.deque()
    self.tokens = 0
    self.evicted = 0
    self._rng = np.random.default_rng(seed)

  def __len__(self) -> int:
    return len(self._segments)

  @property
  def newest_step(self) -> int:
    return max((s.step for s in self._segments), default=-1)

  def add(self, seg: Segment) -> None:
    if seg.length < self.cfg.min_length:
      return
    if seg.length > self.cfg.max_tokens:
      raise ValueError(f"A {seg.length}-token segment exceeds the buffer's capacity "
                       f"({self.cfg.max_tokens} tokens); raise BufferConfig.max_tokens.")
    self._segments.append(seg)
    self.tokens += seg.length
    while self.tokens > self.cfg.max_tokens:  # oldest RL step first (segments arrive in order)
      old = self._segments.popleft()
      self.tokens -= old.length
      self.evicted += 1

  def add_rollout(self, prompts, group_size: int, result, version: int, step: int) -> int:
    """Adds every row of a `RolloutEngine.generate(..., capture_hidden=True)` result."""
    if result.hidden is None:
      raise ValueError("The rollout was run without capture_hidden=True: no hidden states.")
    for i, n in enumerate(result.lengths):
      n = int(n)
      toks = np.concatenate([[prompts[i // group_size][-1]], result.tokens[i, :n]]).astype(np.int32)
      hidden = np.concatenate([result.prompt_hidden[i][None], result.hidden[i, :n]], axis=0)
      self.add(Segment(toks, hidden, version, step))
    return len(result.lengths)

  def weights(self) -> np.ndarray:
    """Sampling probabilities of the stored segments (length and recency)."""
    lengths = np.array([s.length for s in self._segments], np.float64)
    age = self.newest_step - np.array([s.step for s in self._segments], np.float64)
    w = lengths ** self.cfg.length_power * 0.5 ** (age / self.cfg.half_life)
    return w / w.sum()

  def sample(self, rows: int, rng: np.random.Generator | None = None) -> list[Segment]:
    """`rows` segments drawn with `weights()` (with replacement)."""
    if not self._segments:
      raise ValueError("The drafter's data buffer is empty: run a rollout with capture first.")
    idx = (rng or self._rng).choice(len(self._segments), size=rows, p=self.weights())
    return [self._segments[i] for i in idx]

  def segments(self) -> list[Segment]:
    return list(self._segments)


def pack_segments(segs: list[Segment], seq_len: int, pad_id: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Tokens `[B, L]`, hidden states `[B, L, D]` and a validity mask `[B, L]`; segments longer
  than `seq_len` contribute a random window (so the tail's late positions are trained too)."""
  d = segs[0].hidden_LxD.shape[1]
  toks = np.full((len(segs), seq_len), pad_id, np.int32)
  hidden = np.zeros((len(segs), seq_len, d), segs[0].hidden_LxD.dtype)
  mask = np.zeros((len(segs), seq_len), np.float32)
  rng = np.random.default_rng(sum(s.length for s in segs))
  for i, s in enumerate(segs):
    start = int(rng.integers(0, s.length - seq_len + 1)) if s.length > seq_len else 0
    n = min(s.length, seq_len)
    toks[i, :n] = s.tokens_L[start: start + n]
    hidden[i, :n] = s.hidden_LxD[start: start + n]
    mask[i, :n] = 1.0
  return toks, hidden, mask
