"""A step's samples: the rows of one or more rollout rounds with their rewards, the groups a
learner keeps, and the update's packed arrays.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class Samples:
  """Rows of `prompts_P` x `group_size`: responses (token lists), the rollout's log-probs of
  their tokens `[R, N]` (zeros past each length), lengths `[R]`, the task's rewards `[R]`, and
  `active_R`: False for rows that only fill a slot (their tokens are masked out of the update)."""

  prompts_P: list
  answers_P: list
  group_size: int
  responses: list
  logprobs_RxN: np.ndarray
  lengths_R: np.ndarray
  rewards_R: np.ndarray
  active_R: np.ndarray

  @property
  def num_groups(self) -> int:
    """Prompt groups held."""
    return len(self.prompts_P)

  def rewards_PxG(self) -> np.ndarray:
    """The task's rewards, one row per group."""
    return self.rewards_R.reshape(-1, self.group_size)

  def groups(self, which_P) -> "Samples":
    """The groups `which_P` (indices, in that order)."""
    which_P = np.asarray(which_P, np.int64)
    rows_R = (which_P[:, None] * self.group_size + np.arange(self.group_size)).reshape(-1)
    return Samples([self.prompts_P[i] for i in which_P], [self.answers_P[i] for i in which_P],
                   self.group_size, [self.responses[i] for i in rows_R], self.logprobs_RxN[rows_R],
                   self.lengths_R[rows_R], self.rewards_R[rows_R], self.active_R[rows_R])

  def inactive(self) -> "Samples":
    """These rows as fillers: the same shapes, out of the update."""
    return dataclasses.replace(self, active_R=np.zeros_like(self.active_R))

  @staticmethod
  def concat(parts: list["Samples"]) -> "Samples":
    """The groups of `parts`, in order."""
    g = parts[0].group_size
    return Samples(sum((p.prompts_P for p in parts), []), sum((p.answers_P for p in parts), []),
                   g, sum((p.responses for p in parts), []),
                   np.concatenate([p.logprobs_RxN for p in parts]),
                   np.concatenate([p.lengths_R for p in parts]),
                   np.concatenate([p.rewards_R for p in parts]),
                   np.concatenate([p.active_R for p in parts]))

  def pack(self, prompt_bucket: int, n: int, pad_id: int):
    """Sequences `[R, L]` (prompt left-aligned, response right after it), prompt lengths `[R]`,
    response masks `[R, N]` (zero for inactive rows)."""
    g = self.group_size
    toks, plen, mask = pack_rows([self.prompts_P[i // g] for i in range(len(self.responses))],
                                 self.responses, prompt_bucket, n, pad_id)
    return toks, plen, mask * self.active_R[:, None].astype(np.float32)


def select_groups(rounds: list[Samples], keep_P_per_round: list[np.ndarray],
                  num_groups: int) -> tuple[Samples, int]:
  """`num_groups` groups: the kept ones, round by round in order, then (when too few were kept)
  the first round's dropped groups as inactive fillers. Returns them and how many are kept."""
  kept = [r.groups(np.flatnonzero(k)) for r, k in zip(rounds, keep_P_per_round)]
  chosen = Samples.concat(kept)
  n_kept = min(chosen.num_groups, num_groups)
  chosen = chosen.groups(np.arange(n_kept))
  if n_kept < num_groups:
    dropped = np.flatnonzero(~keep_P_per_round[0])[: num_groups - n_kept]
    chosen = Samples.concat([chosen, rounds[0].groups(dropped).inactive()])
  return chosen, n_kept


def pack_rows(prompts, responses, prompt_bucket: int, n: int, pad_id: int):
  """Sequences `[R, P + N]` (prompt left-aligned, response right after it), prompt lengths,
  response masks `[R, N]`."""
  r = len(responses)
  toks = np.full((r, prompt_bucket + n), pad_id, np.int32)
  mask = np.zeros((r, n), np.float32)
  plen = np.zeros(r, np.int32)
  for i, (p, resp) in enumerate(zip(prompts, responses)):
    toks[i, : len(p)] = p
    toks[i, len(p): len(p) + len(resp)] = resp
    mask[i, : len(resp)] = 1.0
    plen[i] = len(p)
  return toks, plen, mask
