"""Model configuration and named presets.

Tensor-name letter legend, used across the package for shape-suffixed names:
  B batch rows, T tokens per row in one call, S cache slots (max sequence), D model width,
  N query heads, K key/value heads, G query heads per kv head (N // K), H head dim,
  F feed-forward width, V vocabulary, L layers.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from tlt_jax.models.families import Family, get_family

RopeLayout = Literal["half", "interleaved"]
NUMERICS = ("fast", "invariant")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of a decoder of one of the `families` (llama, qwen2, qwen3).

  `rope_layout` is "half" for Hugging Face's rotate-half convention and "interleaved" for
  GGUF/llama.cpp's pairs (2i, 2i+1). The family switches the decoder's variants (`qkv_bias`,
  `qk_norm`).
  """

  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  d_ff: int
  head_dim: int | None = None
  rope_theta: float = 10000.0
  rope_layout: RopeLayout = "half"
  norm_eps: float = 1e-5
  family: str = "llama"
  tie_embeddings: bool = True
  max_seq_len: int = 512
  dtype: str = "float32"
  param_dtype: str = "float32"
  # Llama 3.1's RoPE scaling: (factor, low_freq_factor, high_freq_factor, original context);
  # None: plain RoPE. Left out of repr, so the keys of existing policies' artifacts stay as
  # they were; `target_fingerprint` and the executable pool add it where it is set.
  llama3_rope: tuple | None = dataclasses.field(default=None, repr=False)
  # "fast" (XLA orders each reduction by the call's shapes) or "invariant" (every position's
  # numbers the same whatever the call: `invariant.py`). Out of repr, as `llama3_rope`: the
  # same model, the same drafters.
  numerics: str = dataclasses.field(default="fast", repr=False)

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff",
                 "max_seq_len"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}.")
    if self.n_heads % self.n_kv_heads:
      raise ValueError(
          f"ModelConfig.n_heads={self.n_heads} must be a multiple of n_kv_heads="
          f"{self.n_kv_heads} (grouped-query attention shares each kv head among "
          "n_heads // n_kv_heads query heads).")
    if self.head_dim is None and self.d_model % self.n_heads:
      raise ValueError(
          f"ModelConfig.d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
          "set head_dim explicitly.")
    if self.hd % 2:
      raise ValueError(f"head_dim must be even for RoPE, got {self.hd}.")
    if self.rope_layout not in ("half", "interleaved"):
      raise ValueError(
          f"rope_layout must be 'half' or 'interleaved', got {self.rope_layout!r}.")
    if self.numerics not in NUMERICS:
      raise ValueError(f"numerics must be one of {', '.join(NUMERICS)}, got {self.numerics!r}.")
    get_family(self.family)

  @property
  def family_spec(self) -> Family:
    """The model family's definition (`models/families/`)."""
    return get_family(self.family)

  @property
  def qkv_bias(self) -> bool:
    """Biases on the q, k and v projections (Qwen2)."""
    return self.family_spec.qkv_bias

  @property
  def qk_norm(self) -> bool:
    """An RMSNorm over each head's query and key before RoPE (Qwen3)."""
    return self.family_spec.qk_norm

  @property
  def hd(self) -> int:
    """Head dimension H."""
    return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

  def replace(self, **kwargs) -> "ModelConfig":
    """A copy with `changes` applied."""
    return dataclasses.replace(self, **kwargs)

  def to_dict(self) -> dict:
    """The fields as a plain dict (what `save_pretrained` writes)."""
    return dataclasses.asdict(self)


PRESETS: dict[str, ModelConfig] = {
    # A few million parameters: the built-in task's policy, for correctness, CI and the demo.
    "tiny": ModelConfig(
        vocab_size=32, d_model=192, n_layers=4, n_heads=6, n_kv_heads=2, d_ff=512,
        rope_theta=10000.0, max_seq_len=384, tie_embeddings=True),
}


# Architectures of public checkpoints without their weights: for planning a run's memory
# (`rl/memory.py`) and for benchmarks on random weights (`experiments/configs/bench_gpu.py`).
SHAPES: dict[str, ModelConfig] = {
    "smollm2_135m": ModelConfig(
        family="llama", vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3,
        d_ff=1536, rope_theta=100000.0, tie_embeddings=True, max_seq_len=8192),
    "qwen2p5_1p5b": ModelConfig(
        family="qwen2", vocab_size=151936, d_model=1536, n_layers=28, n_heads=12, n_kv_heads=2,
        d_ff=8960, rope_theta=1000000.0, norm_eps=1e-6, tie_embeddings=True, max_seq_len=32768),
    "qwen2p5_7b": ModelConfig(
        family="qwen2", vocab_size=152064, d_model=3584, n_layers=28, n_heads=28, n_kv_heads=4,
        d_ff=18944, rope_theta=1000000.0, norm_eps=1e-6, tie_embeddings=False,
        max_seq_len=32768),
}


def get_shape(name: str) -> ModelConfig:
  """The architecture of a named public checkpoint (`SHAPES`), or a clear error listing them."""
  if name not in SHAPES:
    raise ValueError(f"Unknown model shape {name!r}; known shapes: {sorted(SHAPES)}.")
  return SHAPES[name]


def get_preset(name: str) -> ModelConfig:
  """Returns the config of a named preset, or a clear error listing the known ones."""
  if name not in PRESETS:
    raise ValueError(f"Unknown model preset {name!r}; known presets: {sorted(PRESETS)}.")
  return PRESETS[name]
