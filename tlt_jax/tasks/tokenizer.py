"""Character-level tokenizer of the built-in arithmetic task."""

from __future__ import annotations

from typing import Sequence

PAD, BOS, EOS = 0, 1, 2
_CHARS = "0123456789+-*=;#:QA \n"


class CharTokenizer:
  """Maps each character of the task's alphabet to one id; ids 0-2 are PAD, BOS, EOS."""

  pad_id, bos_id, eos_id = PAD, BOS, EOS

  def __init__(self, vocab_size: int = 32):
    self.chars = _CHARS
    if vocab_size < 3 + len(self.chars):
      raise ValueError(f"vocab_size must be >= {3 + len(self.chars)}, got {vocab_size}.")
    self.vocab_size = vocab_size
    self._to_id = {c: i + 3 for i, c in enumerate(self.chars)}

  FILE = "char_tokenizer.json"

  def save(self, directory: str) -> None:
    """Written next to an exported policy, so `load_pretrained(directory)` finds this tokenizer."""
    import json
    import os
    with open(os.path.join(directory, self.FILE), "w") as f:
      json.dump({"kind": "char", "vocab_size": self.vocab_size, "chars": self.chars}, f)

  def encode(self, text: str) -> list[int]:
    try:
      return [self._to_id[c] for c in text]
    except KeyError as e:
      raise ValueError(f"Character {e.args[0]!r} is not in the task alphabet {self.chars!r}.") from e

  def decode(self, ids: Sequence[int], stop_at_eos: bool = True) -> str:
    out = []
    for i in ids:
      i = int(i)
      if i == EOS and stop_at_eos:
        break
      if i >= 3 and i - 3 < len(self.chars):
        out.append(self.chars[i - 3])
    return "".join(out)
