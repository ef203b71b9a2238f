"""Model families: what tells one Hugging Face architecture from another.

Every family runs on the one decoder (`models/transformer.py`), whose flags (`qkv_bias`,
`qk_norm`, ...) cover their differences. A family is one file here holding its `Family`: the
`config.json` architecture it reads, the checks and flags that map that config onto a
`ModelConfig`, and the keys it writes back. Adding a family is adding a file and a line below.
"""

from __future__ import annotations

from tlt_jax.models.families import llama, qwen2, qwen3
from tlt_jax.models.families.family import Family

FAMILIES: dict[str, Family] = {f.name: f for f in (llama.FAMILY, qwen2.FAMILY, qwen3.FAMILY)}


def get_family(name: str) -> Family:
  """The family called `name`, or a clear error listing the known ones."""
  if name not in FAMILIES:
    raise ValueError(f"Unknown model family {name!r}; known families: {sorted(FAMILIES)}.")
  return FAMILIES[name]


def family_of_architectures(architectures: list[str], source: str) -> Family:
  """The family of a `config.json`'s `architectures` list, or a clear error."""
  for f in FAMILIES.values():
    if f.architecture in architectures:
      return f
  raise ValueError(f"{source}: architectures {architectures} are not supported; tlt_jax loads "
                   f"{sorted(f.architecture for f in FAMILIES.values())} checkpoints.")


__all__ = ["FAMILIES", "Family", "family_of_architectures", "get_family"]
