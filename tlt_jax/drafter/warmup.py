"""Offline warm-up of the drafter on the target's own rollouts, cached per target.

The target samples responses to task prompts with the rollout engine; the drafter is trained with
TLT's loss on those sequences (teacher forcing on the target's hidden states). The result is saved
with its config under a key made of the target's weights and the warm-up settings, so later runs
load it instead of retraining. A drafter shipped with the package (`assets/drafters/<name>/`:
`drafter.safetensors` and `recipe.json` with its key and the command that remakes it) is used
before the cache by every warm-up with its key, and can be named wherever a drafter is taken
(`resolve_drafter`: `demo`, `smollm2`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from tqdm import tqdm

from tlt_jax.checkpoint import Checkpointer
from tlt_jax.drafter import serving
from tlt_jax.drafter.model import Drafter, DrafterConfig, init_drafter
from tlt_jax.drafter.train import DrafterTrainConfig, DrafterTrainer
from tlt_jax.drafter.warmup_data import WarmupData
from tlt_jax.hashing import content_digest
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.models.transformer import PARAM_LAYOUT
from tlt_jax.paths import as_path, exclusive, write_safetensors

SHIPPED_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets",
                            "drafters")
WEIGHTS = "drafter.safetensors"
RECIPE = "recipe.json"


@dataclasses.dataclass(frozen=True)
class WarmupConfig:
  """The offline warm-up's training: steps, batch rows, sequence length, samples per prompt of
  the target's rollouts, and the seed. `prompt_loss`: the loss also covers the prompts'
  positions, which the drafter attends to but never drafts (the first warm-ups did); False
  scores the drafted positions alone, from each row's last prompt token on."""

  steps: int = 300        # training steps
  batch_rows: int = 32    # sequences per step
  seq_len: int = 256      # tokens per sequence
  group_size: int = 4     # rollouts per warm-up prompt
  seed: int = 0           # the rollouts', the drafter's init and the batches' draws
  prompt_loss: bool = True


def target_fingerprint(target) -> str:
  """A short hash of the target's weights and config (which drafter belongs to which policy),
  whatever its compute dtype: a policy run in bf16 uses the drafter of its float32 self."""
  h = hashlib.sha256(repr(target.cfg.replace(dtype="float32")).encode())
  if target.cfg.llama3_rope is not None:  # not in the config's repr
    h.update(repr(target.cfg.llama3_rope).encode())
  for x in jax.tree.leaves(nnx.state(target, nnx.Param)):
    a = np.asarray(x)
    h.update(a.tobytes()[:4096])
    h.update(np.float64(a.astype(np.float64).sum()).tobytes())
  return h.hexdigest()[:12]


def draft_vocabulary(toks, mask, size: int, vocab_size: int) -> tuple[int, ...]:
  """The `size` tokens most frequent in the (masked) sequences, ties by id, in increasing order."""
  counts = np.bincount(toks[mask > 0].ravel(), minlength=vocab_size)
  return tuple(sorted(int(t) for t in np.argsort(-counts, kind="stable")[:size]))


def train_on_sequences(target, toks, mask, data: WarmupData, dcfg: DrafterConfig,
                       tcfg: DrafterTrainConfig, wcfg: WarmupConfig,
                       progress: bool = True) -> tuple[Drafter, dict]:
  """Trains a fresh drafter on the sequences (picking its draft vocabulary first if restricted),
  with the target's features over them from `data`."""
  start = time.time()
  if dcfg.draft_vocab and not dcfg.vocab_ids:
    dcfg = dataclasses.replace(dcfg, vocab_ids=draft_vocabulary(toks, mask, dcfg.draft_vocab,
                                                                target.cfg.vocab_size))
  trainer = DrafterTrainer(init_drafter(target.cfg, dcfg, seed=wcfg.seed), target, tcfg)
  feats, hidden = data.features(toks, mask, dcfg, progress=progress)
  toks, mask = toks[:, :feats.shape[1]], mask[:, :feats.shape[1]]  # the columns holding tokens
  if not wcfg.prompt_loss:
    mask = data.drafted(mask)
  rng = np.random.default_rng(wcfg.seed)
  metrics = {}
  bar = tqdm(range(wcfg.steps), desc="drafter warm-up", disable=not progress, mininterval=2.0)
  for _ in bar:
    idx = rng.choice(len(toks), size=min(wcfg.batch_rows, len(toks)), replace=False)
    metrics = trainer.step(jnp.asarray(toks[idx]), jnp.asarray(feats[idx]),
                           jnp.asarray(hidden[idx]), jnp.asarray(mask[idx]))
    bar.set_postfix(loss=f"{metrics['loss']:.3f}", top1=f"{metrics['top1_agreement']:.2f}")
  return trainer.drafter(), dict(metrics, seconds=round(time.time() - start, 1))


def save_drafter(drafter: Drafter, directory: str, meta: dict) -> None:
  """The deployable artifact: orbax parameters plus the drafter and target configs as JSON, and
  the same weights as `drafter.safetensors` (dotted parameter paths, configs and `meta` in its
  metadata) for other frameworks and for shipping."""
  state = nnx.state(drafter, nnx.Param)
  configs = {"drafter_config": dataclasses.asdict(drafter.cfg),
             "target_config": drafter.target_cfg.to_dict()}
  ck = Checkpointer(directory, keep=1, local=True)
  ck.save(0, state, {**meta, **configs})
  ck.wait()
  flat = {".".join(map(str, path)): np.asarray(v, np.float32)
          for path, v in nnx.to_flat_state(state)}
  write_safetensors(flat, as_path(directory) / WEIGHTS,
                    metadata={"configs": json.dumps(configs, default=str),
                              "meta": json.dumps(meta, default=str)})


# A target's precision policy is not its identity: a policy run in bf16, or in invariant
# numerics, drafts with the drafter of its float32 self (`target_fingerprint` keys them alike).
_PRECISION_FIELDS = ("dtype", "param_dtype", "numerics")


def _drafter_config(configs: dict, target, where: str) -> DrafterConfig:
  """The drafter config saved in `configs`, after checking it was made for `target` (whatever
  the precision either runs in)."""
  same = lambda d: {**{k: v for k, v in d.items()
                       if not (k == "llama3_rope" and v is None) and k not in _PRECISION_FIELDS},
                    "head_dim": d.get("head_dim") or d["d_model"] // d["n_heads"]}
  if configs.get("target_config") and same(configs["target_config"]) != same(target.cfg.to_dict()):
    raise ValueError(f"The drafter in {where} was made for another target "
                     f"({configs['target_config']}); warm up one for this policy.")
  return _config_from(configs)


def _config_from(configs: dict) -> DrafterConfig:
  return DrafterConfig(**{k: tuple(v) if isinstance(v, list) else v
                          for k, v in configs.get("drafter_config", {}).items()})


def load_drafter(directory: str, target) -> tuple[Drafter, dict]:
  """Loads a saved drafter for `target`; the target's config must match the one it was made for."""
  ck = Checkpointer(directory, keep=1, local=True)
  if ck.latest_step() is None:
    raise FileNotFoundError(f"No drafter artifact in {directory}; create one with "
                            "`python -m experiments.drafter_warmup`.")
  dcfg = _drafter_config(ck.read_meta(), target, directory)
  abstract = nnx.eval_shape(lambda: init_drafter(target.cfg, dcfg))
  graphdef, abstract_params = nnx.split(abstract, nnx.Param)
  params, meta, _ = ck.restore(abstract_params)
  return nnx.merge(graphdef, params), meta


def load_shipped_drafter(directory: str, target) -> tuple[Drafter, dict]:
  """Loads the `drafter.safetensors` in `directory` (a shipped drafter) for `target`."""
  path = os.path.join(directory, WEIGHTS)
  with safe_open(path, framework="numpy") as f:
    info = f.metadata() or {}
    flat = {name: f.get_tensor(name) for name in f.keys()}
  dcfg = _drafter_config(json.loads(info.get("configs", "{}")), target, path)
  drafter = nnx.eval_shape(lambda: init_drafter(target.cfg, dcfg))
  graphdef, abstract = nnx.split(drafter, nnx.Param)
  leaves = []
  for p, v in nnx.to_flat_state(abstract):
    name = ".".join(map(str, p))
    if name not in flat or flat[name].shape != v.shape:
      raise ValueError(f"{path} does not hold this drafter's parameter {name} {v.shape}; "
                       "regenerate it with `make warmstart`.")
    leaves.append((p, jnp.asarray(flat[name], v.dtype)))
  return nnx.merge(graphdef, nnx.from_flat_state(leaves)), json.loads(info.get("meta", "{}"))


def ship_drafter(cache_dir: str, name: str, key: str, command: str,
                 root: str = SHIPPED_ROOT) -> str:
  """Copies the weights file of the cached drafter in `cache_dir` to `root/name` (the package's
  assets) beside its `recipe.json` (its key and the `command` that remakes it); returns that
  directory."""
  directory = os.path.join(root, name)
  os.makedirs(directory, exist_ok=True)
  shutil.copyfile(os.path.join(cache_dir, WEIGHTS), os.path.join(directory, WEIGHTS))
  with open(os.path.join(directory, RECIPE), "w") as f:
    json.dump({"key": key, "command": command}, f, indent=1)
  return directory


def shipped_drafters(root: str = SHIPPED_ROOT) -> dict[str, dict]:
  """{name: its recipe.json} of every drafter shipped under `root`."""
  out = {}
  for name in sorted(os.listdir(root)) if os.path.isdir(root) else ():
    if os.path.exists(os.path.join(root, name, RECIPE)):
      with open(os.path.join(root, name, RECIPE)) as f:
        out[name] = json.load(f)
  return out


def resolve_drafter(name_or_dir: str, root: str = SHIPPED_ROOT) -> str:
  """The artifact directory of a drafter given by directory or by the name of a shipped one."""
  if os.path.isdir(name_or_dir):
    return name_or_dir
  if name_or_dir in shipped_drafters(root):
    return os.path.join(root, name_or_dir)
  raise FileNotFoundError(f"No drafter {name_or_dir!r}: give an artifact directory or one of the "
                          f"shipped names {sorted(shipped_drafters(root))}.")


def drafter_artifact_config(directory: str) -> DrafterConfig:
  """The architecture of the drafter saved in `directory` (shipped or cached), read from its
  weights file's metadata without loading the weights."""
  path = os.path.join(directory, WEIGHTS)
  if not os.path.exists(path) and serving.is_eagle_folder(directory):
    return serving.folder_drafter_config(directory)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{directory} holds no drafter ({WEIGHTS} is missing); give a "
                            "drafter artifact directory, an EAGLE-1 folder or a shipped drafter's "
                            "name.")
  with safe_open(path, framework="numpy") as f:
    configs = json.loads((f.metadata() or {}).get("configs", "{}"))
  return _config_from(configs)


def load_any_drafter(directory: str, target) -> tuple[Drafter, dict]:
  """A drafter artifact: a shipped one (`recipe.json` beside its weights), a cached warm-up, or a
  folder in a serving layout, EAGLE-1 or speculators' EAGLE-3 (ours exported, or a released
  checkpoint: `serving.py`; what its import leaves out in `meta["notes"]`)."""
  if serving.is_eagle_folder(directory) and not os.path.exists(os.path.join(directory, WEIGHTS)):
    drafter, notes = serving.import_folder(directory, target)
    return drafter, {"notes": notes}
  if os.path.exists(os.path.join(directory, RECIPE)):
    return load_shipped_drafter(directory, target)
  return load_drafter(directory, target)


# Drafter settings added after drafters were first shipped enter the key only when they differ from
# their defaults, so that the keys of drafters trained without them stay the same.
_LATER_FIELDS = {"label_temperature": 1.0, "tv_weight": 0.0, "accept_weighting": False,
                 "architecture": "tlt"}
_LATER_WARMUP_FIELDS = {"prompt_loss": True}
_LATER_TRAIN_FIELDS = {"decay_steps": 0}


def _later(fields: dict, later: dict) -> dict:
  """`fields` less those added later that hold their former behaviour's value."""
  return {k: v for k, v in fields.items() if k not in later or v != later[k]}


def warmup_key(target, prompts, params: SamplingParams, dcfg: DrafterConfig,
               tcfg: DrafterTrainConfig, wcfg: WarmupConfig) -> str:
  """The drafter's cache key: the target's weights, the warm-up settings and its prompts (and,
  for an "eagle3" drafter, that its labels are the target's own: ones cached before drew them
  through the drafter's output norm)."""
  fields = [PARAM_LAYOUT, target_fingerprint(target),
            _later(dataclasses.asdict(dcfg), _LATER_FIELDS),
            _later(dataclasses.asdict(tcfg), _LATER_TRAIN_FIELDS),
            _later(dataclasses.asdict(wcfg), _LATER_WARMUP_FIELDS), repr(params),
            [list(map(int, p)) for p in prompts]]
  return content_digest(fields + (["target labels"] if dcfg.architecture == "eagle3" else []))


def warmup_data(target, prompts, params: SamplingParams, wcfg: WarmupConfig, pad_id: int,
                cache_root: str, seed: int | None = None) -> WarmupData:
  """The rollouts of `prompts` (`wcfg.group_size` samples each, under `seed`, default
  `wcfg.seed`) and the target's features over them, cached under `cache_root`."""
  return WarmupData(os.path.join(cache_root, "drafter_data"), target,
                    content_digest([PARAM_LAYOUT, target_fingerprint(target)]), prompts, params,
                    wcfg.group_size, wcfg.seq_len, wcfg.seed if seed is None else seed, pad_id)


def teacher_forced_metrics(drafter: Drafter, target, data: WarmupData, batch_rows: int,
                           progress: bool = True) -> dict:
  """The training loss's metrics of `drafter` on `data`'s sequences at the positions it drafts
  (`WarmupData.drafted`, the prompts as context), without an update (means over whole batches
  of `batch_rows`): on rollouts it never trained on, a validation set whose total variation per
  depth is what the `rejection` rule's acceptance per depth sees."""
  toks, mask = data.sequences()
  feats, hidden = data.features(toks, mask, drafter.cfg, progress=progress)
  toks, mask = toks[:, :feats.shape[1]], mask[:, :feats.shape[1]]
  mask = data.drafted(mask)  # scored where drafts are: what the acceptance sees
  trainer = DrafterTrainer(drafter, target)
  size = min(batch_rows, len(toks))  # whole batches only: one shape, one program
  batches = [trainer.metrics(*(jnp.asarray(x[i: i + size]) for x in (toks, feats, hidden, mask)))
             for i in range(0, len(toks) - size + 1, size)]
  return {k: round(float(np.mean([b[k] for b in batches])), 4) for k in batches[0]}


def warm_up(target, prompts, params: SamplingParams, *, pad_id: int, dcfg: DrafterConfig,
            tcfg: DrafterTrainConfig, wcfg: WarmupConfig, cache_root: str,
            progress: bool = True) -> tuple[Drafter, dict]:
  """The warm-up drafter for `target`: shipped with the package, else cached, else trained (on
  rollouts and features that `warmup_data.WarmupData` reuses across recipes) and cached.
  `meta["key"]` is its key; `meta["shipped"]` says where it came from."""
  key = warmup_key(target, prompts, params, dcfg, tcfg, wcfg)
  for name, info in shipped_drafters().items():
    if info["key"] == key:
      drafter, meta = load_shipped_drafter(os.path.join(SHIPPED_ROOT, name), target)
      return drafter, dict(meta, cache=os.path.join(SHIPPED_ROOT, name), cached=True,
                           shipped=True, key=key)
  directory = os.path.join(cache_root, "drafter", key)
  with exclusive(directory):  # another process training the same drafter: wait, then load it
    if (as_path(directory).is_dir()
        and Checkpointer(directory, local=True).latest_step() is not None):
      drafter, meta = load_drafter(directory, target)
      return drafter, dict(meta, cache=directory, cached=True, shipped=False, key=key)
    data = warmup_data(target, prompts, params, wcfg, pad_id, cache_root)
    toks, mask = data.sequences()
    drafter, metrics = train_on_sequences(target, toks, mask, data, dcfg, tcfg, wcfg, progress)
    save_drafter(drafter, directory, metrics)
  return drafter, dict(metrics, cache=directory, cached=False, shipped=False, key=key,
                       data_loaded=data.loaded)
