"""The serving layouts: EAGLE-1 as vLLM and SGLang serve it (a drafter exported into it, and a
folder in it, ours or a released EAGLE-1 checkpoint in safetensors, imported as an "eagle"
drafter), and EAGLE-3 in the `speculators` format that `vllm serve` loads (an "eagle3" drafter
exported, `speculators_tensors`, and a folder in it, ours or saved by the library, imported,
`import_speculators`; `import_folder` tells the two apart by the config).

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

An imported EAGLE-1 folder is read as vLLM reads it: `fc.bias` and a layer-0 `input_layernorm`,
which vLLM's EAGLE-1 skips, are left out, each said in one line; a folder whose sizes differ from
the policy's is one line naming what does not fit. An EAGLE-3 folder whose sizes, fused layers,
normalisation flags (EAGLE-3.1's `norm_output` and the like) or `d2t` do not fit is one line too;
its head and embedding are the policy's in ours (a folder whose differ says so in one line).

The `speculators` folder of an "eagle3" drafter holds what the library's `Eagle3DraftModel` saves:
`fc.weight` (our `feat_proj`, over the fused target layers), the midlayer `layers.0.*` with its
`hidden_norm`, `norm.weight`, `lm_head.weight` (the policy's head rows of the draft vocabulary),
`d2t` (draft index -> target token id minus the index) and `t2d` (which target tokens the draft
vocabulary holds), `embed_tokens.weight` (the policy's), and a `config.json` in its format
(`eagle_aux_hidden_state_layer_ids`: the target layers fused, indexed as vLLM indexes them, the
input of that layer, 0 being the embedding; `transformer_layer_config`: the Llama or Qwen3 layer).
"""

from __future__ import annotations

import json
import types

import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import load_file

from tlt_jax.drafter.model import Drafter, DrafterConfig, init_drafter, layer_config
from tlt_jax.models import weights
from tlt_jax.models.pretrained import config_to_hf
from tlt_jax.paths import as_path, write_safetensors

FORMATS = ("eagle", "speculators")
# speculators' EAGLE-3 midlayer is a Llama or a Qwen3 layer (its `model_definitions`).
_SPECULATORS_FAMILIES = ("llama", "qwen3")
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


def _check_fits(directory: str, layer: dict, cfg, drafter: str) -> None:
  """One line where a folder's layer config `layer` has other sizes than the policy's layer
  `cfg`, or more than the one layer `drafter` has."""
  for key, ours in _SIZES.items():
    if layer.get(key, getattr(cfg, ours)) != getattr(cfg, ours):
      raise ValueError(f"{directory} is a drafter for another model: its {key} is {layer[key]}, "
                       f"the policy's is {getattr(cfg, ours)}.")
  if int(layer.get("num_hidden_layers", 1)) != 1:
    raise ValueError(f"{directory} has {layer['num_hidden_layers']} layers; {drafter} has one.")


def import_eagle(directory: str, target) -> tuple[Drafter, list[str]]:
  """The EAGLE-1 folder in `directory` as an "eagle" drafter of `target` (a `Transformer`), and
  what the import left out (one sentence each)."""
  config, tensors = _read_folder(directory)
  if any(k.startswith(("midlayer.", "d2t", "t2d")) for k in tensors):
    raise ValueError(f"{directory} holds an EAGLE-3 drafter; only EAGLE-1 folders are imported.")
  if "fc.weight" not in tensors or not any(k.startswith("layers.0.") for k in tensors):
    raise ValueError(f"{directory} holds no EAGLE-1 drafter (fc.weight and layers.0.* expected).")
  cfg = layer_config(target.cfg)
  _check_fits(directory, config, cfg, "an EAGLE-1 drafter")
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


def is_speculators_config(config: dict) -> bool:
  """Whether a folder's `config.json` is in speculators' format (and then EAGLE-3 only)."""
  return "speculators_model_type" in config


_SPECULATORS_OFF = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def speculators_drafter_config(config: dict, d2t: np.ndarray, vocab: int) -> DrafterConfig:
  """The `DrafterConfig` of the speculators EAGLE-3 folder whose `config.json` is `config`."""
  if config["speculators_model_type"] != "eagle3":
    raise ValueError(f"holds a speculators {config['speculators_model_type']!r} drafter; only "
                     "EAGLE-3 is imported.")
  on = [k for k in _SPECULATORS_OFF if config.get(k)]
  if on:
    raise ValueError(f"sets {', '.join(on)}, which the 'eagle3' drafter does not compute.")
  layers = config.get("eagle_aux_hidden_state_layer_ids")
  if not layers:
    raise ValueError("names no eagle_aux_hidden_state_layer_ids (the target layers it fuses).")
  ids = np.arange(len(d2t)) + d2t
  if list(ids) != sorted(set(ids.tolist())) or ids.min() < 0 or ids.max() >= vocab:
    raise ValueError("has a d2t that maps its draft vocabulary to no increasing set of the "
                     "policy's tokens.")
  restricted = len(ids) < vocab
  return DrafterConfig(architecture="eagle3", feature_layers=tuple(int(i) for i in layers),
                       draft_vocab=len(ids) if restricted else 0,
                       vocab_ids=tuple(int(i) for i in ids) if restricted else ())


def import_speculators(directory: str, target) -> tuple[Drafter, list[str]]:
  """The EAGLE-3 folder in speculators' format in `directory` (saved by the library, or ours) as
  an "eagle3" drafter of `target`, and what differs from the folder's model (one sentence each:
  a head or embedding other than the policy's, which ours always drafts with)."""
  config, tensors = _read_folder(directory)
  cfg = layer_config(target.cfg)
  _check_fits(directory, config["transformer_layer_config"], cfg, "the 'eagle3' drafter")
  try:
    dcfg = speculators_drafter_config(config, np.asarray(tensors["d2t"]), cfg.vocab_size)
  except ValueError as e:
    raise ValueError(f"{directory} {e}") from None
  if max(dcfg.feature_layers) >= target.cfg.n_layers:
    raise ValueError(f"{directory} fuses the inputs of target layers "
                     f"{list(dcfg.feature_layers)}; the policy has {target.cfg.n_layers} layers.")
  drafter = nnx.eval_shape(lambda: init_drafter(target.cfg, dcfg))
  layer = {"model." + k: v for k, v in tensors.items() if k.startswith("layers.0.")}
  if cfg.rope_layout == "interleaved":
    layer = weights.permute_qk_rows(layer, cfg, to="interleaved")
  weights.assign(types.SimpleNamespace(layers=[drafter.layer]), layer, cfg, directory,
                 keep=lambda n: n.startswith(_LAYER))
  pd = jnp.dtype(target.cfg.param_dtype)
  drafter.feat_proj.kernel.value = jnp.asarray(tensors["fc.weight"].T, pd)
  drafter.layer.hidden_norm.scale.value = jnp.asarray(tensors["layers.0.hidden_norm.weight"], pd)
  drafter.norm.scale.value = jnp.asarray(tensors["norm.weight"], pd)
  mine = speculators_tensors(drafter, target)
  notes = [f"its {name} differs from the policy's {what}; the drafter drafts with the policy's"
           for name, what in (("lm_head", "head rows"), ("embed_tokens", "embedding"))
           if f"{name}.weight" in tensors
           and not np.array_equal(tensors[f"{name}.weight"], mine[f"{name}.weight"])]
  return drafter, notes


def import_folder(directory: str, target) -> tuple[Drafter, list[str]]:
  """A serving folder, EAGLE-1 or speculators' EAGLE-3 (told apart by its config), as a drafter
  of `target`, with what its import leaves out or changes."""
  config, _ = _read_folder(directory)
  if is_speculators_config(config):
    return import_speculators(directory, target)
  return import_eagle(directory, target)


def folder_drafter_config(directory: str) -> DrafterConfig:
  """The `DrafterConfig` a serving folder imports as, read without its weights but `d2t`."""
  config = json.loads((as_path(directory) / CONFIG).read_text())
  if not is_speculators_config(config):
    return DrafterConfig(architecture="eagle")
  with safe_open(str(as_path(directory) / WEIGHTS), framework="numpy") as f:
    return speculators_drafter_config(config, f.get_tensor("d2t"),
                                      config["transformer_layer_config"]["vocab_size"])


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


def default_format(drafter: Drafter) -> str:
  """The serving layout that holds `drafter` exactly: speculators' for "eagle3", else EAGLE-1."""
  return "speculators" if drafter.cfg.architecture == "eagle3" else "eagle"


def serving_folder(drafter: Drafter) -> str:
  """The name a run gives the drafter's serving folder beside its exported policy."""
  return f"drafter_{'eagle3' if default_format(drafter) == 'speculators' else 'eagle'}"


def speculators_tensors(drafter: Drafter, target) -> dict[str, np.ndarray]:
  """An "eagle3" drafter of `target` in the names, shapes and RoPE layout of speculators'
  `Eagle3DraftModel` (float32; `d2t` int64, `t2d` bool)."""
  cfg = layer_config(drafter.target_cfg)
  layer = weights.export(types.SimpleNamespace(layers=[drafter.layer]), cfg,
                         keep=lambda n: n.startswith(_LAYER))
  out = {name[len("model."):]: np.asarray(arr, np.float32) for name, arr in layer.items()}
  if cfg.rope_layout == "interleaved":
    out = weights.permute_qk_rows(out, cfg, to="half")
  v = target.cfg.vocab_size
  ids = np.asarray(drafter.cfg.vocab_ids or range(v), np.int64)
  head_VxD = np.asarray(target.embed.embedding[...] if target.cfg.tie_embeddings
                        else np.asarray(target.lm_head.kernel[...]).T, np.float32)
  t2d = np.zeros(v, bool)
  t2d[ids] = True
  return out | {
      "fc.weight": np.asarray(drafter.feat_proj.kernel[...], np.float32).T,
      "layers.0.hidden_norm.weight": np.asarray(drafter.layer.hidden_norm.scale[...], np.float32),
      "norm.weight": np.asarray(drafter.norm.scale[...], np.float32),
      "lm_head.weight": np.ascontiguousarray(head_VxD[ids]),
      "embed_tokens.weight": np.asarray(target.embed.embedding[...], np.float32),
      "d2t": ids - np.arange(len(ids)), "t2d": t2d}


def speculators_config(drafter: Drafter, verifier: str | None, depth: int = 3) -> dict:
  """The `config.json` speculators writes for an EAGLE-3 drafter of these sizes, whose verifier
  (the policy, in Hugging Face's layout; the library reads its config) is the folder `verifier`."""
  layer = config_to_hf(layer_config(drafter.target_cfg).replace(rope_layout="half"), None)
  if layer["model_type"] not in _SPECULATORS_FAMILIES:
    raise ValueError(f"speculators' EAGLE-3 has Llama and Qwen3 midlayers, not "
                     f"{layer['model_type']!r}: export this drafter with --format=eagle.")
  n = drafter.target_cfg.n_layers
  if max(drafter.cfg.feature_layers) >= n:
    raise ValueError(f"vLLM fuses the inputs of target layers 0..{n - 1}, and this drafter "
                     f"reads {list(drafter.cfg.feature_layers)} ({n}: the last layer's output).")
  return {
      "architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3",
      "draft_vocab_size": len(drafter.cfg.vocab_ids) or drafter.target_cfg.vocab_size,
      "eagle_aux_hidden_state_layer_ids": list(drafter.cfg.feature_layers),
      "norm_before_residual": False, "norm_before_fc": False, "fc_norm": False,
      "norm_output": False, "embed_requires_grad": False, "target_hidden_size": None,
      "tie_word_embeddings": False, "transformer_layer_config": layer,
      "speculators_config": {
          "algorithm": "eagle3", "default_proposal_method": "greedy",
          "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": depth,
                                "accept_tolerance": 0.0, "verifier_accept_k": 1}],
          "verifier": {"architectures": layer["architectures"], "name_or_path": verifier}},
      "dtype": "float32"}


def export_drafter(drafter: Drafter, directory: str, fmt: str | None = None,
                   target=None, verifier: str | None = None) -> list[str]:
  """Writes the drafter's serving folder into `directory` in `fmt` (default `default_format`;
  "speculators" needs the `target` whose embedding and head it copies, and names the folder
  `verifier` that holds it in Hugging Face's layout); returns `differences(drafter)`."""
  fmt = fmt or default_format(drafter)
  if fmt not in FORMATS:
    raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}.")
  if (fmt == "speculators") != (drafter.cfg.architecture == "eagle3"):
    raise ValueError(f"an {drafter.cfg.architecture!r} drafter exports as "
                     f"--format={default_format(drafter)}, not {fmt}.")
  directory = as_path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  if fmt == "speculators":
    if target is None:
      raise ValueError("the speculators format holds the policy's embedding and head: pass the "
                       "policy (target) the drafter drafts for.")
    config = speculators_config(drafter, verifier)
    tensors = speculators_tensors(drafter, target)
  else:
    config = config_to_hf(layer_config(drafter.target_cfg).replace(rope_layout="half"), None)
    tensors = eagle_tensors(drafter)
  write_safetensors(tensors, directory / WEIGHTS, metadata={"format": "pt"})
  config["tlt_jax"] = {"architecture": drafter.cfg.architecture, "format": fmt,
                       "draft_vocab": len(drafter.cfg.vocab_ids)}
  (directory / CONFIG).write_text(json.dumps(config, indent=2))
  notes = [] if fmt == "speculators" else differences(drafter)
  (directory / "README.md").write_text(_readme(notes, fmt))
  return notes


_SERVE = {
    "eagle": ("EAGLE-1", [
        "vllm serve POLICY --speculative-config "
        "'{\"method\": \"eagle\", \"model\": \"THIS_FOLDER\", \"num_speculative_tokens\": 3}'",
        "python -m sglang.launch_server --model-path POLICY --speculative-algorithm EAGLE "
        "--speculative-draft-model-path THIS_FOLDER --speculative-num-steps 3 "
        "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4"]),
    "speculators": ("EAGLE-3 (speculators format)", [
        "vllm serve POLICY --speculative-config "
        "'{\"method\": \"eagle3\", \"model\": \"THIS_FOLDER\", \"num_speculative_tokens\": 3}'",
        "python -m sglang.launch_server --model-path POLICY --speculative-algorithm EAGLE3 "
        "--speculative-draft-model-path THIS_FOLDER --speculative-num-steps 3 "
        "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4"])}


def _readme(notes: list[str], fmt: str) -> str:
  name, commands = _SERVE[fmt]
  lines = [f"# An {name} drafter exported by tlt_jax", "",
           "Serve it beside the policy it was trained with (POLICY: that policy's folder):", "",
           "```", *commands, "```", ""]
  if notes:
    lines += ["What the served drafter does otherwise than in tlt_jax:", ""]
    lines += [f"- {n}." for n in notes] + [""]
  return "\n".join(lines)
