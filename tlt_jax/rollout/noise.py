"""Where a row's randomness comes from: its noise address.

A row's noise at response position `t` is `fold_in(fold_in(key, address...), t)`, one fold per
word of its address but for the zero words that end it after the first
(`models/sampling.noise_key`): a sample id padded with zeros is the noise of the id alone. Two
ways to address it (`rollout.noise`):

- `"step"` (one word, the sample id `i = prompt_index * G + g` in the call): the caller's key
  changes every RL step, so every step's samples are fresh draws.
- `"prompt"` (`PROMPT_WORDS` words): the run's fixed key and, per row, a stable 64-bit id of its
  prompt's tokens (two 32-bit words), the prompt's noise epoch (its visits so far divided by
  `noise_refresh`; 0 when that is 0), its occurrence in the step (a prompt drawn twice in one
  step, as a duplicate or by a top-up round, gets other noise the second time) and the index of
  the sample in its group. The same sample of the same prompt then gets the same noise in every
  step, which is what lets a stored response be replayed exactly (`rollout/history.py`).

`PromptNoise` hands out prompt addresses and counts visits; its counts travel in checkpoints, so
a resumed run addresses what a straight one would.
"""

from __future__ import annotations

import hashlib

import numpy as np

NOISE_MODES = ("step", "prompt")
PROMPT_WORDS = 5  # prompt id (2 words), noise epoch, occurrence in the step, sample in the group


def prompt_id(tokens) -> tuple[int, int]:
  """A stable 64-bit id of a prompt's tokens, as two unsigned 32-bit halves."""
  digest = hashlib.blake2b(np.asarray(tokens, np.int64).tobytes(), digest_size=8).digest()
  return int.from_bytes(digest[:4], "little"), int.from_bytes(digest[4:], "little")


def as_words(addresses_RxW) -> np.ndarray:
  """Unsigned address words as the int32 the engine's programs carry (the same bits)."""
  return np.asarray(addresses_RxW, np.uint32).view(np.int32)


def step_addresses(num_rows: int, first_sample: int = 0, words: int = 1) -> np.ndarray:
  """`[R, words]` int32: each row's sample id, then zeros (an engine of `words` > 1 given no
  addresses, e.g. a held-out evaluation, which never replays)."""
  out = np.zeros((num_rows, words), np.int32)
  out[:, 0] = first_sample + np.arange(num_rows)
  return out


class PromptNoise:
  """Prompt-addressed noise for a run: the addresses of a step's rows, and each prompt's visits
  (steps it was drawn in), from which its noise epoch follows."""

  def __init__(self, refresh: int = 0):
    if refresh < 0:
      raise ValueError(f"noise_refresh must be >= 0 (0: never), got {refresh}.")
    self.refresh = refresh
    self.visits: dict[tuple[int, int], int] = {}
    self._seen: dict[tuple[int, int], int] = {}  # this step's occurrences so far

  def epoch(self, pid: tuple[int, int]) -> int:
    """The noise epoch of prompt `pid` in the current step."""
    return self.visits.get(pid, 0) // self.refresh if self.refresh else 0

  def addresses(self, prompts, group_size: int) -> np.ndarray:
    """`[len(prompts) * G, PROMPT_WORDS]` int32 addresses of a round's rows (prompt-major, as
    the engine orders them); each prompt's occurrence counts on within the step."""
    out = np.zeros((len(prompts) * group_size, PROMPT_WORDS), np.uint32)
    for i, tokens in enumerate(prompts):
      pid = prompt_id(tokens)
      occurrence = self._seen.get(pid, 0)
      self._seen[pid] = occurrence + 1
      rows = slice(i * group_size, (i + 1) * group_size)
      out[rows, :4] = (*pid, self.epoch(pid), occurrence)
      out[rows, 4] = np.arange(group_size)
    return as_words(out)

  def end_step(self) -> None:
    """Counts a visit for every prompt drawn in the step now ending."""
    for pid in self._seen:
      self.visits[pid] = self.visits.get(pid, 0) + 1
    self._seen = {}

  def state(self) -> dict:
    """The visit counts as arrays (for a checkpoint; one sentinel row: it holds no empty
    arrays)."""
    ids = np.array(sorted(self.visits) + [(0, 0)], np.uint32).reshape(-1, 2)
    counts = np.array([self.visits.get(tuple(map(int, p)), 0) for p in ids], np.int32)
    return {"ids": ids, "visits": counts}

  def load_state(self, state: dict) -> None:
    """Restores the visit counts of `state()`."""
    ids, visits = np.asarray(state["ids"]).reshape(-1, 2)[:-1], np.asarray(state["visits"])[:-1]
    self.visits = {(int(a), int(b)): int(v) for (a, b), v in zip(ids, visits)}
    self._seen = {}
