"""The EAGLE-1 layout that vLLM and SGLang serve: a drafter exported into it, and a folder in it
(ours, or a released EAGLE-1 checkpoint in safetensors) imported as an "eagle" drafter.

The folder holds `config.json` (a one-layer model of the target's family and sizes, in the
Hugging Face rotate-half RoPE layout), `model.safetensors` (`fc.weight`, `fc.bias`, `layers.0.*`
in Hugging Face names and `[out, in]` float32 tensors; the embedding and the head are the served
policy's own) and a README naming the serving commands. vLLM's EAGLE-1 model
(`model_executor/models/llama_eagle.py`) has `fc` without a bias and skips a bias it is given;
SGLang's keeps it: `fc.bias` is written (zeros for an "eagle" drafter), so both compute the same.

An "eagle" drafter (`DrafterConfig.architecture`) is that model exactly. A "tlt" drafter is not:
EAGLE-1 has no input norm in its layer and no output norm, and vLLM drops `fc`'s bias; its export
says so in one line (`differences`), as it does for a restricted draft vocabulary, which EAGLE-1
cannot hold (the served drafter drafts over the policy's whole head).

An imported folder is read as vLLM reads it: `fc.bias` and a layer-0 `input_layernorm`, which
vLLM's EAGLE-1 skips, are left out, each said in one line; a folder whose sizes
differ from the policy's, or in another layout (EAGLE-3), is one line naming what does not fit.
"""

from __future__ import annotations

import json
import types

import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import load_file

from tlt_jax.drafter.model import Drafter, DrafterConfig, init_drafter, layer_config
from tlt_jax.models import weights
from tlt_jax.models.pretrained import config_to_hf
from tlt_jax.paths import as_path, write_safetensors

FORMATS = ("eagle",)
_LAYER = "model.layers.0."
CONFIG, WEIGHTS = "config.json", "model.safetensors"
# Hugging Face config keys an EAGLE-1 folder must share with the policy, by our config's field.
_SIZES = {"hidden_size": "d_model", "num_attention_heads": "n_heads",
          "num_key_value_heads": "n_kv_heads", "intermediate_size": "d_ff"}


def is_eagle_folder(directory: str) -> bool:
  """Whether `directory` holds a drafter in a serving layout (config.json beside safetensors)."""
  d = as_path(directory)
  return (d / CONFIG).exists() and (d / WEIGHTS).exists()


def _read_folder(directory: str) -> tuple[dict, dict[str, np.ndarray]]:
  d = as_path(directory)
  if not (d / CONFIG).exists():
    raise ValueError(f"{directory} has no {CONFIG}: not an EAGLE drafter folder.")
  if not (d / WEIGHTS).exists():
    raise ValueError(f"{directory} has no {WEIGHTS} (a .bin checkpoint: save it as safetensors "
                     "first).")
  return json.loads((d / CONFIG).read_text()), load_file(d / WEIGHTS)


def _import_notes(tensors: dict[str, np.ndarray]) -> list[str]:
  """What importing a folder of `tensors` leaves out, as vLLM does, one sentence each."""
  out = []
  if "fc.bias" in tensors and np.any(tensors["fc.bias"]):
    out.append("its fc.bias is left out, as vLLM's EAGLE-1 does (SGLang would apply it)")
  if "layers.0.input_layernorm.weight" in tensors:
    out.append("its layer-0 input_layernorm is left out, as vLLM's and SGLang's EAGLE-1 do")
  return out


def import_eagle(directory: str, target) -> tuple[Drafter, list[str]]:
  """The EAGLE-1 folder in `directory` as an "eagle" drafter of `target` (a `Transformer`), and
  what the import left out (one sentence each)."""
  config, tensors = _read_folder(directory)
  if any(k.startswith(("midlayer.", "d2t", "t2d")) for k in tensors):
    raise ValueError(f"{directory} holds an EAGLE-3 drafter; only EAGLE-1 folders are imported.")
  if "fc.weight" not in tensors or not any(k.startswith("layers.0.") for k in tensors):
    raise ValueError(f"{directory} holds no EAGLE-1 drafter (fc.weight and layers.0.* expected).")
  cfg = layer_config(target.cfg)
  for key, ours in _SIZES.items():
    if config.get(key, getattr(cfg, ours)) != getattr(cfg, ours):
      raise ValueError(f"{directory} is a drafter for another model: its {key} is {config[key]}, "
                       f"the policy's is {getattr(cfg, ours)}.")
  if int(config.get("num_hidden_layers", 1)) != 1:
    raise ValueError(f"{directory} has {config['num_hidden_layers']} layers; an EAGLE-1 drafter "
                     "has one.")
  fc = tensors["fc.weight"]
  if fc.shape != (cfg.d_model, 2 * cfg.d_model):
    raise ValueError(f"{directory}: fc.weight has shape {fc.shape}, the policy needs "
                     f"{(cfg.d_model, 2 * cfg.d_model)}.")
  drafter = nnx.eval_shape(lambda: init_drafter(target.cfg, DrafterConfig(architecture="eagle")))
  layer = {"model." + k: v for k, v in tensors.items() if k.startswith("layers.0.")}
  if cfg.rope_layout == "interleaved":
    layer = weights.permute_qk_rows(layer, cfg, to="interleaved")
  skip = "input_layernorm.weight"
  weights.assign(types.SimpleNamespace(layers=[drafter.layer]), layer, cfg, directory,
                 keep=lambda n: n.startswith(_LAYER) and not n.endswith(skip))
  drafter.fc.kernel.value = jnp.asarray(fc.T, jnp.dtype(target.cfg.param_dtype))
  return drafter, _import_notes(tensors)


def differences(drafter: Drafter) -> list[str]:
  """What the served drafter will compute otherwise than ours, one sentence each."""
  out = []
  if drafter.cfg.architecture != "eagle":
    out.append("this 'tlt' drafter's layer input norm and output norm have no place in EAGLE-1 "
               "and are left out, and vLLM ignores fc's bias: the served drafter computes another "
               "function and its drafts differ (train with drafter.model.architecture='eagle' to "
               "serve it exactly)")
  if drafter.restricted:
    out.append(f"EAGLE-1 drafts with the policy's whole head: the served drafter proposes any "
               f"token, not only its {len(drafter.cfg.vocab_ids)}-token draft vocabulary")
  return out


def eagle_tensors(drafter: Drafter) -> dict[str, np.ndarray]:
  """The drafter's weights in EAGLE-1's names, `[out, in]` float32, RoPE rows rotate-half."""
  cfg = layer_config(drafter.target_cfg)
  fc = drafter.fc
  out = {"fc.weight": np.asarray(fc.kernel[...], np.float32).T,
         "fc.bias": (np.asarray(fc.bias[...], np.float32) if fc.bias is not None
                     else np.zeros(cfg.d_model, np.float32))}
  skip = "input_layernorm.weight" if drafter.layer.input_norm is None else None
  layer = weights.export(types.SimpleNamespace(layers=[drafter.layer]), cfg,
                         keep=lambda n: n.startswith(_LAYER) and not (skip and n.endswith(skip)))
  out |= {name[len("model."):]: np.asarray(arr, np.float32) for name, arr in layer.items()}
  return weights.permute_qk_rows(out, cfg, to="half") if cfg.rope_layout == "interleaved" else out


def export_drafter(drafter: Drafter, directory: str, fmt: str = "eagle") -> list[str]:
  """Writes the drafter's serving folder into `directory`; returns `differences(drafter)`."""
  if fmt not in FORMATS:
    raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}.")
  directory = as_path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  cfg = layer_config(drafter.target_cfg)
  write_safetensors(eagle_tensors(drafter), directory / WEIGHTS,
                    metadata={"format": "pt"})
  config = config_to_hf(cfg.replace(rope_layout="half"), None)
  config["tlt_jax"] = {"architecture": drafter.cfg.architecture, "format": fmt,
                       "draft_vocab": len(drafter.cfg.vocab_ids)}
  (directory / CONFIG).write_text(json.dumps(config, indent=2))
  notes = differences(drafter)
  (directory / "README.md").write_text(_readme(notes))
  return notes


def _readme(notes: list[str]) -> str:
  lines = ["# An EAGLE-1 drafter exported by tlt_jax", "",
           "Serve it beside the policy it was trained with (POLICY: that policy's folder):", "",
           "```",
           "vllm serve POLICY --speculative-config "
           "'{\"method\": \"eagle\", \"model\": \"THIS_FOLDER\", \"num_speculative_tokens\": 3}'",
           "python -m sglang.launch_server --model-path POLICY --speculative-algorithm EAGLE "
           "--speculative-draft-model-path THIS_FOLDER --speculative-num-steps 3 "
           "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
           "```", ""]
  if notes:
    lines += ["What the served drafter does otherwise than in tlt_jax:", ""]
    lines += [f"- {n}." for n in notes] + [""]
  return "\n".join(lines)
