"""Offline warm-up of the drafter on the target's own rollouts, cached per target.

The target samples responses to task prompts with the rollout engine; the drafter is trained with
TLT's loss on those sequences (teacher forcing on the target's hidden states). The result is saved
with its config under a key made of the target's weights and the warm-up settings, so later runs
load it instead of retraining.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from tlt_jax.checkpoint import Checkpointer
from tlt_jax.drafter.model import Drafter, DrafterConfig, init_drafter
from tlt_jax.drafter.train import DrafterTrainConfig, DrafterTrainer, teacher_batch
from tlt_jax.models.transformer import PARAM_LAYOUT
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.rollout.sampling import SamplingParams


@dataclasses.dataclass(frozen=True)
class WarmupConfig:
  steps: int = 300
  batch_rows: int = 32
  seq_len: int = 256
  group_size: int = 4
  seed: int = 0


def target_fingerprint(target) -> str:
  """A short hash of the target's weights and config (which drafter belongs to which policy)."""
  h = hashlib.sha256(repr(target.cfg).encode())
  for x in jax.tree.leaves(nnx.state(target, nnx.Param)):
    a = np.asarray(x)
    h.update(a.tobytes()[:4096])
    h.update(np.float64(a.astype(np.float64).sum()).tobytes())
  return h.hexdigest()[:12]


def rollout_sequences(target, prompts, params: SamplingParams, cfg: WarmupConfig,
                      pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Prompt + sampled response of every row, padded to `seq_len`, with a validity mask."""
  engine = RolloutEngine(target, EngineConfig(batch_buckets=(1, 2, 4, 8, 16, 32, 64, 128),
                                              max_batch=128, precompile=False), pad_id=pad_id)
  res = engine.generate(prompts, cfg.group_size, params, jax.random.key(cfg.seed))
  rows = len(prompts) * cfg.group_size
  toks = np.full((rows, cfg.seq_len), pad_id, np.int32)
  mask = np.zeros((rows, cfg.seq_len), np.float32)
  for i in range(rows):
    seq = (list(prompts[i // cfg.group_size]) + res.response(i))[: cfg.seq_len]
    toks[i, : len(seq)], mask[i, : len(seq)] = seq, 1.0
  return toks, mask


def draft_vocabulary(toks, mask, size: int, vocab_size: int) -> tuple[int, ...]:
  """The `size` tokens most frequent in the (masked) sequences, ties by id, in increasing order."""
  counts = np.bincount(toks[mask > 0].ravel(), minlength=vocab_size)
  return tuple(sorted(int(t) for t in np.argsort(-counts, kind="stable")[:size]))


def teacher_features(target, toks, dcfg: DrafterConfig, chunk: int = 16, progress: bool = True):
  """(features, final hidden) of the frozen target over every sequence, computed once in jitted
  chunks, so that training steps do not repeat the target's forward. For EAGLE (final hidden as
  the feature) both are the same array."""
  graphdef, state = nnx.split(target)

  @jax.jit
  def forward(state, tokens_BxL):
    return teacher_batch(nnx.merge(graphdef, state), tokens_BxL, dcfg)

  n = len(toks)
  padded = np.concatenate([toks, np.repeat(toks[-1:], -n % chunk, axis=0)])
  feats, hidden = [], []
  for i in tqdm(range(0, n, chunk), desc="target features", disable=not progress,
                mininterval=2.0):
    f, h = jax.device_get(forward(state, jnp.asarray(padded[i: i + chunk])))
    feats.append(f)
    hidden.append(h if dcfg.feature_layers else None)
  feats = np.concatenate(feats)[:n]
  return feats, (np.concatenate(hidden)[:n] if dcfg.feature_layers else feats)


def train_on_sequences(target, toks, mask, dcfg: DrafterConfig, tcfg: DrafterTrainConfig,
                       wcfg: WarmupConfig, progress: bool = True) -> tuple[Drafter, dict]:
  """Trains a fresh drafter on the sequences (picking its draft vocabulary first if restricted)."""
  start = time.time()
  if dcfg.draft_vocab and not dcfg.vocab_ids:
    dcfg = dataclasses.replace(dcfg, vocab_ids=draft_vocabulary(toks, mask, dcfg.draft_vocab,
                                                                target.cfg.vocab_size))
  trainer = DrafterTrainer(init_drafter(target.cfg, dcfg, seed=wcfg.seed), target, tcfg)
  feats, hidden = teacher_features(target, toks, dcfg, progress=progress)
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
  the same weights as `drafter.safetensors` (dotted parameter paths) for other frameworks."""
  from safetensors.numpy import save_file
  state = nnx.state(drafter, nnx.Param)
  configs = {"drafter_config": dataclasses.asdict(drafter.cfg),
             "target_config": drafter.target_cfg.to_dict()}
  ck = Checkpointer(directory, keep=1)
  ck.save(0, state, {**meta, **configs})
  ck.wait()
  flat = {".".join(map(str, path)): np.asarray(v, np.float32)
          for path, v in nnx.to_flat_state(state)}
  save_file(flat, os.path.join(directory, "drafter.safetensors"),
            metadata={"configs": json.dumps(configs, default=str)})


def load_drafter(directory: str, target) -> tuple[Drafter, dict]:
  """Loads a saved drafter for `target`; the target's config must match the one it was made for."""
  ck = Checkpointer(directory, keep=1)
  if ck.latest_step() is None:
    raise FileNotFoundError(f"No drafter artifact in {directory}; create one with "
                            "`python -m experiments.drafter_warmup`.")
  meta = ck.read_meta()
  dcfg = DrafterConfig(**{k: tuple(v) if isinstance(v, list) else v
                          for k, v in meta.get("drafter_config", {}).items()})
  same = lambda d: {**d, "head_dim": d.get("head_dim") or d["d_model"] // d["n_heads"]}
  if meta.get("target_config") and same(meta["target_config"]) != same(target.cfg.to_dict()):
    raise ValueError(f"The drafter in {directory} was made for another target "
                     f"({meta['target_config']}); warm up one for this policy.")
  abstract = nnx.eval_shape(lambda: init_drafter(target.cfg, dcfg))
  graphdef, abstract_params = nnx.split(abstract, nnx.Param)
  params, meta, _ = ck.restore(abstract_params)
  return nnx.merge(graphdef, params), meta


def warm_up(target, prompts, params: SamplingParams, *, pad_id: int, dcfg: DrafterConfig,
            tcfg: DrafterTrainConfig, wcfg: WarmupConfig, cache_root: str,
            progress: bool = True) -> tuple[Drafter, dict]:
  """The cached warm-up drafter for `target` (trained and cached first if missing)."""
  key = hashlib.sha256(json.dumps([PARAM_LAYOUT, target_fingerprint(target),
                                   dataclasses.asdict(dcfg), dataclasses.asdict(tcfg),
                                   dataclasses.asdict(wcfg), repr(params),
                                   [list(map(int, p)) for p in prompts]],
                                  default=str).encode()
                       ).hexdigest()[:12]
  directory = os.path.join(cache_root, "drafter", key)
  if os.path.isdir(directory) and Checkpointer(directory).latest_step() is not None:
    drafter, meta = load_drafter(directory, target)
    return drafter, dict(meta, cache=directory, cached=True)
  toks, mask = rollout_sequences(target, prompts, params, wcfg, pad_id)
  drafter, metrics = train_on_sequences(target, toks, mask, dcfg, tcfg, wcfg, progress)
  save_drafter(drafter, directory, metrics)
  return drafter, dict(metrics, cache=directory, cached=False)
