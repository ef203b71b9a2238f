"""Qwen3 (dense): an RMSNorm over each head's query and key before RoPE, no q/k/v bias, and a
`head_dim` that need not be `hidden_size / num_attention_heads` (the loader reads it)."""

from tlt_jax.models.families.family import Family


def check_hf(hf: dict, source: str) -> None:
  """Raises where a Qwen3 `config.json` asks for what this decoder does not implement."""
  if hf.get("use_sliding_window"):
    raise ValueError(f"{source}: Qwen3 sliding-window attention is not supported.")
  if hf.get("attention_bias"):
    raise ValueError(f"{source}: Qwen3 attention_bias checkpoints are not supported.")


FAMILY = Family(name="qwen3", architecture="Qwen3ForCausalLM", model_type="qwen3", qk_norm=True,
                check_hf=check_hf,
                hf_keys=(("attention_bias", False), ("use_sliding_window", False)))
