"""Llama (and SmolLM2, and the built-in `tiny` preset): the plain decoder."""

from tlt_jax.models.families.family import Family


def check_hf(hf: dict, source: str) -> None:
  """Raises where a Llama `config.json` asks for what this decoder does not implement."""
  if hf.get("attention_bias") or hf.get("mlp_bias"):
    raise ValueError(f"{source}: Llama attention_bias/mlp_bias checkpoints are not supported.")


FAMILY = Family(name="llama", architecture="LlamaForCausalLM", model_type="llama",
                check_hf=check_hf, hf_keys=(("attention_bias", False), ("mlp_bias", False)))
