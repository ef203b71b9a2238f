"""What a model family declares (one instance per file in this folder)."""

from __future__ import annotations

import dataclasses
from typing import Callable


def _no_checks(hf: dict, source: str) -> None:
  del hf, source


@dataclasses.dataclass(frozen=True)
class Family:
  """A decoder variant and its Hugging Face names.

  `qkv_bias` (biases on the q, k and v projections) and `qk_norm` (an RMSNorm over each head's
  query and key before RoPE) are the decoder's switches for it. `architecture` and `model_type`
  are its names in a `config.json`; `check_hf(hf, source)` raises a clear error for a variant of
  the family the decoder does not run; `hf_keys` are the family's own keys written back.
  """

  name: str
  architecture: str
  model_type: str
  qkv_bias: bool = False
  qk_norm: bool = False
  check_hf: Callable[[dict, str], None] = _no_checks
  hf_keys: tuple[tuple[str, object], ...] = ()
