"""Bucketed epsilon-greedy (BEG) choice of a speculation strategy per batch-size bucket.

Reward of a dispatch = tokens emitted (all rows) / wall seconds; each (bucket, arm) keeps a sliding
window of rewards and is scored by its median. Untried arms are tried first; with probability
epsilon a random arm explores. Retired arms (see `health.py`) are never chosen.
"""

from __future__ import annotations

import collections

import numpy as np


class BucketedEpsilonGreedy:
  """An epsilon-greedy bandit per batch bucket over the speculative arms, rewarded by tokens per
  second over a sliding window."""

  def __init__(self, arms: int, epsilon: float = 0.1, window: int = 300, seed: int = 0):
    self.arms, self.epsilon = arms, epsilon
    self._rng = np.random.default_rng(seed)
    self._rewards = collections.defaultdict(lambda: collections.deque(maxlen=window))
    self.choices = collections.Counter()

  def choose(self, bucket: int, allowed: list[int]) -> int:
    """An arm for `bucket` among `allowed`: an untried one first, else the best median reward,
    or a random one with probability epsilon."""
    if not allowed:
      raise ValueError("No arm is allowed.")
    untried = [a for a in allowed if not self._rewards[(bucket, a)]]
    if untried:
      arm = untried[0]
    elif self._rng.random() < self.epsilon:
      arm = int(self._rng.choice(allowed))
    else:
      arm = max(allowed, key=lambda a: np.median(self._rewards[(bucket, a)]))
    self.choices[(bucket, arm)] += 1
    return arm

  def update(self, bucket: int, arm: int, reward: float) -> None:
    """Records `reward` (tokens per second) for `arm` at `bucket`."""
    self._rewards[(bucket, arm)].append(float(reward))

  def rewards(self, bucket: int, arm: int) -> list[float]:
    """The rewards in `arm`'s window at `bucket`, oldest first."""
    return list(self._rewards[(bucket, arm)])

  def best(self, bucket: int, allowed: list[int]) -> int | None:
    """The arm with the best median reward at `bucket` (None before any was tried)."""
    tried = [a for a in allowed if self._rewards[(bucket, a)]]
    return max(tried, key=lambda a: np.median(self._rewards[(bucket, a)])) if tried else None
