"""Prompt space in two sides: a stable hash of a prompt's text puts it on the training side or
the held-out side, the same on every machine and run. Dataset files are split this way when no
held-out file is given; the generated tasks (`arithmetic`, `word_problems`) draw every training
prompt (RL pool, SFT data, drafter warm-up) from the training side and every held-out prompt
from the held-out side, so no held-out prompt's text occurs in any training data."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from tlt_jax.errors import ConfigError

T = TypeVar("T")
SPLITS = ("train", "test")


def held_out(text: str, fraction: float) -> bool:
  """Whether prompt `text` falls on the held-out side of a split that puts `fraction` of prompt
  space there."""
  h = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
  return h < fraction * 2**64


def check_fraction(fraction: float, what: str) -> None:
  """A one-line error unless 0 < `fraction` < 1 (both sides must hold prompts)."""
  if not 0.0 < fraction < 1.0:
    raise ValueError(f"{what} must be in (0, 1) (the held-out side's share of prompt space), "
                     f"got {fraction!r}.")


def draw(make_one: Callable[[np.random.Generator], T], text: Callable[[T], str], n: int,
         seed: int, split: str, fraction: float) -> list[T]:
  """`n` items made by `make_one(rng)` whose `text` falls on `split`'s side ("train" or
  "test"), in the order drawn from `seed`. Training items repeat as the generator repeats them;
  held-out items are distinct, and fewer than `n` when the held-out side runs dry (a small
  prompt space) after `100 * n + 1000` draws."""
  if split not in SPLITS:
    raise ValueError(f"split must be 'train' or 'test', got {split!r}.")
  test = split == "test"
  rng, out, seen = np.random.default_rng(seed), [], set()
  for _ in range(100 * n + 1000):
    if len(out) == n:
      break
    item = make_one(rng)
    t = text(item)
    if held_out(t, fraction) != test or (test and t in seen):
      continue
    seen.add(t)
    out.append(item)
  if not test and len(out) < n:
    raise ConfigError(f"The training side of the task's prompt space gave {len(out)} of {n} "
                      "prompts; lower the task's test_fraction or widen its difficulty.")
  return out
