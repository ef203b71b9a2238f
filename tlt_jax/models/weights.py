"""Parameter naming: where each Hugging Face / GGUF tensor lives in the nnx model.

Both formats store projection matrices as `[out, in]`; nnx kernels are `[in, out]`.
"""

from __future__ import annotations

from typing import Iterator

import jax.numpy as jnp
import numpy as np
from flax import nnx

from tlt_jax.models.config import ModelConfig

_GGUF_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
               "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def _layer_table(cfg: ModelConfig) -> list[tuple[str, tuple, tuple[int, int] | None]]:
  """(HF module, path of our kernel, its part or None for all) of one layer's projections: q/k/v
  are parts of `qkv_proj` `[D, K, G + 2, H]` and gate/up of `gate_up_proj` `[D, 2, F]` (see
  `layers`), a part being a range of the kernel's second-to-last axis."""
  g = cfg.n_heads // cfg.n_kv_heads
  return [("self_attn.q_proj", ("attn", "qkv_proj"), (0, g)),
          ("self_attn.k_proj", ("attn", "qkv_proj"), (g, g + 1)),
          ("self_attn.v_proj", ("attn", "qkv_proj"), (g + 1, g + 2)),
          ("self_attn.o_proj", ("attn", "o_proj"), None),
          ("mlp.gate_proj", ("mlp", "gate_up_proj"), (0, 1)),
          ("mlp.up_proj", ("mlp", "gate_up_proj"), (1, 2)),
          ("mlp.down_proj", ("mlp", "down_proj"), None)]


def hf_param_table(cfg: ModelConfig
                   ) -> Iterator[tuple[str, tuple, bool, tuple[int, int] | None]]:
  """Yields (HF tensor name, path in the nnx model, transpose?, part) for every parameter: `part`
  is the (start, stop) range of the second-to-last axis that the tensor fills in a fused
  parameter, None where it is the whole parameter. Parts of one parameter come in order."""
  yield "model.embed_tokens.weight", ("embed", "embedding"), False, None
  yield "model.norm.weight", ("final_norm", "scale"), False, None
  if not cfg.tie_embeddings:
    yield "lm_head.weight", ("lm_head", "kernel"), True, None
  for i in range(cfg.n_layers):
    p = f"model.layers.{i}."
    for hf, ours, part in _layer_table(cfg):
      yield p + hf + ".weight", ("layers", i, *ours, "kernel"), True, part
      if cfg.qkv_bias and hf in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
        yield p + hf + ".bias", ("layers", i, *ours, "bias"), False, part
    if cfg.qk_norm:
      yield p + "self_attn.q_norm.weight", ("layers", i, "attn", "q_norm", "scale"), False, None
      yield p + "self_attn.k_norm.weight", ("layers", i, "attn", "k_norm", "scale"), False, None
    yield p + "input_layernorm.weight", ("layers", i, "input_norm", "scale"), False, None
    yield (p + "post_attention_layernorm.weight", ("layers", i, "post_attn_norm", "scale"), False,
           None)


def _part_shape(shape: tuple[int, ...], part: tuple[int, int] | None) -> tuple[int, ...]:
  """The shape of a part of a parameter of `shape`."""
  return shape if part is None else (*shape[:-2], part[1] - part[0], shape[-1])


def _flat(shape: tuple[int, ...], kernel: bool) -> tuple[int, ...]:
  """The shape Hugging Face stores a part as (after our transpose): a kernel `[in, out]`, a bias
  `[out]`."""
  size = int(np.prod(shape))
  return (shape[0], size // shape[0]) if kernel else (size,)


def gguf_name(hf_name: str) -> str:
  """The GGUF (llama.cpp) name of an HF tensor name."""
  fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
           "output_norm.weight", "lm_head.weight": "output.weight"}
  if hf_name in fixed:
    return fixed[hf_name]
  _, _, i, rest = hf_name.split(".", 3)
  module, kind = rest.rsplit(".", 1)
  return f"blk.{i}.{_GGUF_LAYER[module]}.{kind}"


def get_variable(model, path: tuple) -> nnx.Variable:
  """The variable of `model` at `path` (attribute names and list indices)."""
  node = model
  for p in path:
    node = node[p] if isinstance(p, int) else getattr(node, p)
  return node


def permute_rope_rows(w_OxI: np.ndarray, n_heads: int, head_dim: int, to: str) -> np.ndarray:
  """Reorders the output rows of a q/k projection between RoPE layouts.

  Rotate-half pairs feature i with i + H/2; interleaved pairs 2i with 2i+1. Converting the rows
  makes a model with the other RoPE layout compute exactly the same function.
  """
  rest = w_OxI.shape[1:]
  w = w_OxI.reshape(n_heads, 2, head_dim // 2, *rest) if to == "interleaved" else \
      w_OxI.reshape(n_heads, head_dim // 2, 2, *rest)
  return np.swapaxes(w, 1, 2).reshape(w_OxI.shape)


def assign(model, tensors: dict[str, np.ndarray], cfg: ModelConfig, source: str,
           name_fn=lambda n: n, keep=lambda name: True) -> None:
  """Copies `tensors` (HF layout `[out, in]`) into `model`, checking every name and shape; the
  parts of a fused parameter are concatenated into it. `keep`: only the HF names it accepts."""
  dtype = jnp.dtype(cfg.param_dtype)
  blocks: dict[tuple, list[np.ndarray]] = {}
  for hf_name, path, transpose, part in hf_param_table(cfg):
    if not keep(hf_name):
      continue
    name = name_fn(hf_name)
    if name not in tensors:
      raise KeyError(f"{source} has no tensor {name!r} that a {cfg.n_layers}-layer model needs; "
                     "the checkpoint is incomplete or of another architecture.")
    arr = np.asarray(tensors[name])
    arr = arr.T if transpose else arr
    var = get_variable(model, path)
    shape = _part_shape(tuple(var.shape), part)
    want = shape if part is None else _flat(shape, transpose)
    if tuple(arr.shape) != want:
      raise ValueError(f"{source}: tensor {name!r} has shape {tuple(arr.shape)} (after transpose) "
                       f"but the config implies {want}; config and weights disagree.")
    blocks.setdefault(path, []).append(arr.reshape(shape))
  for path, arrs in blocks.items():
    get_variable(model, path).value = jnp.asarray(
        arrs[0] if len(arrs) == 1 else np.concatenate(arrs, axis=-2), dtype)


def export(model, cfg: ModelConfig, keep=lambda name: True) -> dict[str, np.ndarray]:
  """The model's parameters as HF-named `[out, in]` float arrays (fused ones split back); `keep`:
  only the tensors whose HF name it accepts."""
  out = {}
  for hf_name, path, transpose, part in hf_param_table(cfg):
    if not keep(hf_name):
      continue
    arr = np.asarray(get_variable(model, path).value)
    if part is not None:
      arr = arr[..., part[0]:part[1], :]
      arr = arr.reshape(_flat(arr.shape, transpose))
    out[hf_name] = np.ascontiguousarray(arr.T if transpose else arr)
  return out


def permute_qk_rows(tensors: dict[str, np.ndarray], cfg: ModelConfig, to: str
                    ) -> dict[str, np.ndarray]:
  """HF-named tensors of a model of `cfg` with their q/k projections' rows reordered into the
  RoPE layout `to` ("half": Hugging Face's rotate-half, from a GGUF's interleaved pairs;
  "interleaved": back), so that the function is the same; the other tensors as they are."""
  out = {}
  for name, arr in tensors.items():
    if name.endswith(("q_proj.weight", "q_proj.bias")):
      arr = permute_rope_rows(arr, cfg.n_heads, cfg.hd, to=to)
    elif name.endswith(("k_proj.weight", "k_proj.bias")):
      arr = permute_rope_rows(arr, cfg.n_kv_heads, cfg.hd, to=to)
    elif name.endswith(("q_norm.weight", "k_norm.weight")):  # Qwen3's, one head's features
      arr = permute_rope_rows(arr, 1, cfg.hd, to=to)
    out[name] = arr
  return out
