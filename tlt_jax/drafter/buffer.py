"""The drafter's training data, captured from rollouts: bounded, recency-aware, tail-favouring,
and held on a device.

A rollout run with `capture_hidden=True` yields, for every row, the target's final hidden state at
the last prompt position and at every emitted response token (plain and speculative steps alike).
Each row becomes one `Segment`: tokens `[p_last, r_0, ..., r_{n-1}]` and hidden states at those
positions, tagged with the policy version and RL step that produced them. The drafter learns, at
position t, to map (embed(token t+1), hidden t) to hidden t+1 and the target's next-token
distribution, which is exactly what a segment holds: no second target forward is needed.

The hidden states never go through the host: they are written from the rollout's device pieces
(`tlt_jax.rollout.captured`) into a ring of `max_tokens` rows on the buffer's device, in the
target's compute dtype (memory: max_tokens x D x 4 bytes for float32, x 2 for bf16), and a batch
is gathered from the ring there; the host keeps each segment's tokens and where its hidden states
sit. When full, the oldest RL step's segments go first. Sampling favours what the rollout's tail
is made of: a segment is drawn with probability proportional to length ** `length_power` (long
responses dominate the tail's time) times 0.5 ** (age in RL steps / `half_life`).
"""

from __future__ import annotations

import collections
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from tlt_jax.models.bits import from_storage, storage_dtype, to_storage


@dataclasses.dataclass(frozen=True)
class Segment:
  """One finished row of a rollout in the buffer: its tokens and where its hidden states sit in
  the device ring."""

  tokens_L: np.ndarray        # [L] int32: the last prompt token, then the response
  start: int                  # where its hidden states begin in the stream of tokens the buffer
                              # has written (ring row: start % max_tokens)
  version: int                # policy version: updates applied to the weights that sampled it
  step: int                   # RL step of the rollout

  @property
  def length(self) -> int:
    """Tokens in the segment."""
    return int(self.tokens_L.shape[0])


@dataclasses.dataclass(frozen=True)
class BufferConfig:
  """The buffer's capacity and how it samples: longer and more recent segments more often."""

  max_tokens: int = 200_000   # capacity in segment tokens (rows of the device ring)
  length_power: float = 1.0   # sampling weight ~ length ** length_power
  half_life: float = 4.0      # sampling weight halves every `half_life` RL steps of age
  min_length: int = 2         # shorter segments hold no training pair

  def __post_init__(self):
    if self.max_tokens < 1 or self.half_life <= 0 or self.length_power < 0:
      raise ValueError(f"BufferConfig needs max_tokens >= 1, half_life > 0, length_power >= 0; "
                       f"got {self}.")


@functools.partial(jax.jit, donate_argnums=0, static_argnums=6)
def write_rows(ring_CxD, hidden_BxNxD, prompt_hidden_BxD, slot_K, pos_K, dst_K, dtype):
  """The program of every write into a buffer's ring (donated; kept as
  `bits.storage_dtype(dtype)`): `hidden[slot, pos]` (`prompt_hidden[slot]` where pos is -1), as
  `dtype` values, into ring row `dst`; a `dst` past the ring writes nothing."""
  src_KxD = jnp.where((pos_K < 0)[:, None], prompt_hidden_BxD[slot_K],
                      hidden_BxNxD[slot_K, jnp.maximum(pos_K, 0)])
  return ring_CxD.at[dst_K].set(to_storage(src_KxD.astype(dtype)), mode="drop")


@functools.partial(jax.jit, static_argnums=(2, 3))
def _gather(ring_CxD, idx_BxL, stored, dtype):
  """Ring rows `idx` (`stored` values) in `dtype`; zeros where `idx` is past the ring."""
  rows = ring_CxD.at[idx_BxL].get(mode="fill", fill_value=0)
  return from_storage(rows, stored).astype(dtype)


class DataBuffer:
  """Segments from recent rollouts, at most `max_tokens` tokens in all; their hidden states
  (`d_model` wide, in `dtype`) on `device` (default: the first local device). A 2-byte float
  ring is kept as its bits, so that each write runs in place (`models/bits.py`)."""

  def __init__(self, cfg: BufferConfig, d_model: int, dtype="float32", device=None,
               seed: int = 0):
    self.cfg, self.dtype = cfg, jnp.dtype(dtype)
    self.device = device or jax.local_devices()[0]
    self.ring_CxD = jnp.zeros((cfg.max_tokens, d_model), storage_dtype(self.dtype),
                              device=self.device)
    self._segments: collections.deque[Segment] = collections.deque()
    self._written = 0  # tokens written since the buffer was made
    self.tokens = 0
    self.evicted = 0
    self._rng = np.random.default_rng(seed)

  def _put(self, x) -> jax.Array:
    """`x` on the buffer's device."""
    return jax.device_put(x, self.device)

  def __len__(self) -> int:
    return len(self._segments)

  @property
  def newest_step(self) -> int:
    """The RL step of the newest segment (-1 when empty)."""
    return max((s.step for s in self._segments), default=-1)

  def _place(self, tokens_L, version: int, step: int) -> Segment | None:
    """Reserves ring rows for a segment (evicting the oldest); None when it is too short."""
    n = len(tokens_L)
    if n < self.cfg.min_length:
      return None
    if n > self.cfg.max_tokens:
      raise ValueError(f"A {n}-token segment exceeds the buffer's capacity "
                       f"({self.cfg.max_tokens} tokens); raise BufferConfig.max_tokens.")
    seg = Segment(np.asarray(tokens_L, np.int32), self._written, version, step)
    self._written += n
    self._segments.append(seg)
    self.tokens += n
    while self.tokens > self.cfg.max_tokens:  # oldest RL step first (segments arrive in order)
      old = self._segments.popleft()
      self.tokens -= old.length
      self.evicted += 1
    return seg

  def _rows(self, seg: Segment, offset: int = 0, n: int | None = None) -> np.ndarray:
    n = seg.length - offset if n is None else n
    return ((seg.start + offset + np.arange(n)) % self.cfg.max_tokens).astype(np.int32)

  def add(self, tokens_L, hidden_LxD, version: int, step: int) -> Segment | None:
    """Adds one segment from host arrays (a rollout's rows go through `add_rollout`)."""
    seg = self._place(tokens_L, version, step)
    if seg is not None:
      hidden_LxD = np.asarray(hidden_LxD)
      n = seg.length
      self.ring_CxD = write_rows(self.ring_CxD, self._put(hidden_LxD[None, 1:]),
                                 self._put(hidden_LxD[:1]),
                                 np.zeros(n, np.int32), np.arange(-1, n - 1, dtype=np.int32),
                                 self._rows(seg), self.dtype)
    return seg

  def add_rollout(self, prompts, group_size: int, result, version: int, step: int
                  ) -> list[Segment]:
    """Adds every row of a `RolloutEngine.generate(..., capture_hidden=True)` result, reading
    its hidden states on the device; returns the new segments the buffer still holds."""
    if result.hidden is None:
      raise ValueError("The rollout was run without capture_hidden=True: no hidden states.")
    placed = {}
    for i, n in enumerate(result.lengths):
      toks = [prompts[i // group_size][-1]] + result.tokens[i, :int(n)].tolist()
      placed[i] = self._place(toks, version, step)
    alive = self._segments[0].start if self._segments else self._written
    held = {i: s for i, s in placed.items() if s is not None and s.start >= alive}
    for piece in result.hidden.pieces:
      self._write_piece(piece, held)
    return list(held.values())

  def _write_piece(self, piece, placed: dict) -> None:
    """Writes the rows of one rollout piece that have a place in the ring."""
    b, n = piece.hidden_BxNxD.shape[:2]
    slot_K, pos_K = np.zeros(b * (n + 1), np.int32), np.zeros(b * (n + 1), np.int32)
    dst_K = np.full(b * (n + 1), self.cfg.max_tokens, np.int32)  # past the ring: no write
    k = 0
    for slot, row in zip(piece.slots, piece.rows):
      seg = placed.get(int(row))
      if seg is None:
        continue
      slot_K[k: k + seg.length] = slot
      pos_K[k: k + seg.length] = np.arange(-1, seg.length - 1)
      dst_K[k: k + seg.length] = self._rows(seg)
      k += seg.length
    self.ring_CxD = write_rows(self.ring_CxD, self._put(piece.hidden_BxNxD),
                               self._put(piece.prompt_hidden_BxD), slot_K, pos_K, dst_K,
                               self.dtype)

  def warm_up(self, batch_sizes, n: int, dtype) -> None:
    """Builds the writes of `add_rollout` for pieces of these batch sizes, `n` tokens and the
    rollout's `dtype`, writing nothing."""
    d = self.ring_CxD.shape[1]
    for b in batch_sizes:
      k = b * (n + 1)
      self.ring_CxD = write_rows(
          self.ring_CxD, jnp.zeros((b, n, d), dtype, device=self.device),
          jnp.zeros((b, d), dtype, device=self.device), np.zeros(k, np.int32),
          np.zeros(k, np.int32), np.full(k, self.cfg.max_tokens, np.int32), self.dtype)

  def _read(self, rows_N: np.ndarray) -> np.ndarray:
    """Ring rows `[N, D]` on the host, in the buffer's dtype. The gather reads a power of two of
    rows (the rest past the ring), so that the checkpoints of a run, each holding another count
    of tokens, build one program per doubling rather than one per save."""
    n = len(rows_N)
    padded = np.full(1 << max(n - 1, 0).bit_length(), self.cfg.max_tokens, np.int32)
    padded[:n] = rows_N
    return np.asarray(_gather(self.ring_CxD, padded[None], self.dtype, self.dtype))[0, :n]

  def hidden(self, seg: Segment) -> np.ndarray:
    """A segment's hidden states `[L, D]` on the host (for inspection)."""
    return self._read(self._rows(seg))

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
    """The segments held, oldest first."""
    return list(self._segments)

  def state(self) -> dict:
    """What a checkpoint keeps of the buffer (host arrays): the held segments' tokens end to
    end, lengths, policy versions and RL steps, their hidden states in the same order (`[tokens
    held, D]` in the buffer's dtype: at most `max_tokens` x D), and the eviction count."""
    segs = list(self._segments)
    rows = (np.concatenate([self._rows(s) for s in segs]) if segs
            else np.zeros(0, np.int32))
    return {"tokens": np.concatenate([s.tokens_L for s in segs]) if segs
                      else np.zeros(0, np.int32),
            "lengths": np.array([s.length for s in segs], np.int32),
            "versions": np.array([s.version for s in segs], np.int32),
            "steps": np.array([s.step for s in segs], np.int32),
            "hidden": self._read(rows),
            "evicted": np.int64(self.evicted)}

  def load_state(self, state: dict) -> None:
    """The buffer as `state()` left it: the same segments, in order, with the same hidden
    states (written to the ring's first rows)."""
    hidden = np.asarray(state["hidden"], self.dtype)
    self._segments.clear()
    self._written = self.tokens = 0
    ends = np.cumsum(state["lengths"])
    for end, n, version, step in zip(ends, state["lengths"], state["versions"], state["steps"]):
      self._place(np.asarray(state["tokens"][end - n: end]), int(version), int(step))
    self.ring_CxD = self.ring_CxD.at[:len(hidden)].set(
        to_storage(self._put(hidden)))
    self.evicted = int(state["evicted"])

  def pack(self, segs: list[Segment], seq_len: int, pad_id: int, rows: int | None = None,
           dtype=None) -> tuple[np.ndarray, jax.Array, np.ndarray]:
    """Tokens `[B, L]` (host), hidden states `[B, L, D]` (on the buffer's device, in `dtype`,
    default the buffer's) and a validity mask `[B, L]` (host) of `segs`, padded to `rows`
    rows; segments longer than `seq_len` contribute a random window (so the tail's late
    positions are trained too)."""
    rows = len(segs) if rows is None else rows
    toks = np.full((rows, seq_len), pad_id, np.int32)
    idx = np.full((rows, seq_len), self.cfg.max_tokens, np.int32)  # past the ring: zeros
    mask = np.zeros((rows, seq_len), np.float32)
    rng = np.random.default_rng(sum(s.length for s in segs))
    for i, s in enumerate(segs):
      start = int(rng.integers(0, s.length - seq_len + 1)) if s.length > seq_len else 0
      n = min(s.length, seq_len)
      toks[i, :n] = s.tokens_L[start: start + n]
      idx[i, :n] = self._rows(s, start, n)
      mask[i, :n] = 1.0
    hidden = _gather(self.ring_CxD, self._put(idx), self.dtype,
                     jnp.dtype(dtype or self.dtype))
    return toks, hidden, mask
