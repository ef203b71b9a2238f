"""Qwen2 / Qwen2.5: biases on the q, k and v projections."""

from tlt_jax.models.families.family import Family


def check_hf(hf: dict, source: str) -> None:
  """Raises where a Qwen2 `config.json` asks for what this decoder does not implement."""
  if hf.get("use_sliding_window"):
    raise ValueError(f"{source}: Qwen2 sliding-window attention is not supported.")


FAMILY = Family(name="qwen2", architecture="Qwen2ForCausalLM", model_type="qwen2", qkv_bias=True,
                check_hf=check_hf)
