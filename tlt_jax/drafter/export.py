"""A drafter exported in the EAGLE-1 layout that vLLM and SGLang serve beside its policy.

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
"""

from __future__ import annotations

import json
import types

import numpy as np

from tlt_jax.drafter.model import Drafter, layer_config
from tlt_jax.models import weights
from tlt_jax.models.pretrained import config_to_hf
from tlt_jax.paths import as_path, write_safetensors

FORMATS = ("eagle",)
_LAYER = "model.layers.0."


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
  return weights.rotate_half_layout(out, cfg)


def export_drafter(drafter: Drafter, directory: str, fmt: str = "eagle") -> list[str]:
  """Writes the drafter's serving folder into `directory`; returns `differences(drafter)`."""
  if fmt not in FORMATS:
    raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}.")
  directory = as_path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  cfg = layer_config(drafter.target_cfg)
  write_safetensors(eagle_tensors(drafter), directory / "model.safetensors",
                    metadata={"format": "pt"})
  config = config_to_hf(cfg.replace(rope_layout="half"), None)
  config["tlt_jax"] = {"architecture": drafter.cfg.architecture, "format": fmt,
                       "draft_vocab": len(drafter.cfg.vocab_ids)}
  (directory / "config.json").write_text(json.dumps(config, indent=2))
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
