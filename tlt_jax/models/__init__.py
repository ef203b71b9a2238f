"""Policy models in flax.nnx: one decoder for the Llama, Qwen2 and Qwen3 families (`families/`;
see `config.py` for the shape-letter legend), checkpoints and tokenizers, and the sampling
primitives every layer above uses.

The bottom layer: imports nothing else of tlt_jax.
"""

from tlt_jax.models.config import PRESETS, ModelConfig, get_preset
from tlt_jax.models.kv_cache import CacheOverflowError, KVCache, check_overflow, commit, init_cache
from tlt_jax.models.transformer import ModelOutput, Transformer, abstract_model, init_model

__all__ = [
    "PRESETS", "ModelConfig", "get_preset", "CacheOverflowError", "KVCache", "check_overflow",
    "commit", "init_cache", "ModelOutput", "Transformer", "abstract_model", "init_model",
]
