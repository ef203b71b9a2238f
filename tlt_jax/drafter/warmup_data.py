"""The offline warm-up's training data: the target's own rollouts and its features over them.

Both are the slow part of a warm-up on CPU (SmolLM2: ~20 minutes of rollouts, ~30 of features for
1024 sequences of 384 tokens), and neither depends on the drafter's recipe beyond the target
layers it reads. So they are cached under `<cache_root>/drafter_data/`, the rollouts keyed by
the target's weights, prompts, sampling and warm-up seed, the features by the rollouts and the
layers: a recipe A/B (a loss, an unroll depth, a step count) trains on the same data at once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import load
from tqdm import tqdm

from tlt_jax.drafter.model import DrafterConfig
from tlt_jax.drafter.train import teacher_batch
from tlt_jax.hashing import content_digest
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.paths import as_path, write_safetensors
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine


def rollout_sequences(target, prompts, params: SamplingParams, group_size: int, seq_len: int,
                      seed: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Prompt + sampled response of every row, padded to `seq_len`, with a validity mask."""
  engine = RolloutEngine(target, EngineConfig(batch_buckets=(1, 2, 4, 8, 16, 32, 64, 128),
                                              max_batch=128, precompile=False), pad_id=pad_id)
  res = engine.generate(prompts, group_size, params, jax.random.key(seed))
  rows = len(prompts) * group_size
  toks = np.full((rows, seq_len), pad_id, np.int32)
  mask = np.zeros((rows, seq_len), np.float32)
  for i in range(rows):
    seq = (list(prompts[i // group_size]) + res.response(i))[:seq_len]
    toks[i, : len(seq)], mask[i, : len(seq)] = seq, 1.0
  return toks, mask


def teacher_features(target, toks, dcfg: DrafterConfig, mask=None, chunk: int = 16,
                     progress: bool = True):
  """(features, final hidden) of the frozen target over every sequence, computed once in jitted
  chunks, so that training steps do not repeat the target's forward. For EAGLE (final hidden as
  the feature) both are the same array. With `mask` (1 on each row's tokens, a prefix of it) they
  cover the columns up to the longest row's end, rounded up to 64: past them every row is
  padding, which the drafter's training need not read (a causal reader never attends to it,
  and the mask scores it zero). Fewer rows than `chunk` run in a chunk of the next power of
  two."""
  graphdef, state = nnx.split(target)

  @jax.jit
  def forward(state, tokens_BxL):
    return teacher_batch(nnx.merge(graphdef, state), tokens_BxL, dcfg)

  n, seq_len = toks.shape
  width = seq_len
  if mask is not None and mask.any():
    width = min(seq_len, -(-(int(np.flatnonzero(mask.any(0))[-1]) + 1) // 64) * 64)
  chunk = min(chunk, 1 << (n - 1).bit_length())
  padded = np.concatenate([toks, np.repeat(toks[-1:], -n % chunk, axis=0)])[:, :width]
  feats, hidden = [], []
  for i in tqdm(range(0, n, chunk), desc="target features", disable=not progress,
                mininterval=2.0):
    f, h = jax.device_get(forward(state, jnp.asarray(padded[i: i + chunk])))
    feats.append(f)
    hidden.append(h if dcfg.feature_layers else None)
  feats = np.concatenate(feats)[:n]
  return feats, (np.concatenate(hidden)[:n] if dcfg.feature_layers else feats)


class WarmupData:
  """The rollouts and features of one warm-up, read from `directory` where an earlier warm-up of
  the same target, prompts and sampling left them, else computed and written there whole."""

  def __init__(self, directory: str, target, target_key: str, prompts, params: SamplingParams,
               group_size: int, seq_len: int, seed: int, pad_id: int):
    self.directory, self.target = as_path(directory), target
    self.prompts, self.group_size = prompts, group_size
    self.rollout = (prompts, params, group_size, seq_len, seed, pad_id)
    self.key = content_digest([target_key, repr(params), group_size, seq_len, seed, pad_id,
                               [list(map(int, p)) for p in prompts]])
    self.loaded = []  # which parts came from the cache: "rollouts", "features"

  def _read(self, name: str) -> dict | None:
    path = self.directory / f"{name}.safetensors"
    return load(path.read_bytes()) if path.exists() else None

  def _write(self, name: str, tensors: dict) -> None:
    path = self.directory / f"{name}.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{path.name}.tmp"
    write_safetensors(tensors, tmp, {})
    tmp.replace(path)  # whole or absent: a crash mid-write leaves no half file

  def sequences(self) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, mask) of every rollout row, `[rows, seq_len]`."""
    name = f"rollouts-{self.key}"
    if (got := self._read(name)) is not None:
      self.loaded.append("rollouts")
      return got["tokens"], got["mask"]
    toks, mask = rollout_sequences(self.target, *self.rollout)
    self._write(name, {"tokens": toks, "mask": mask})
    return toks, mask

  def drafted(self, mask):
    """`mask` at the positions a drafter drafts from: each row's last prompt token on (its
    hidden state and the first response token feed the first draft). The prompt before it stays
    in the sequence as context: the engine's prefill feeds it to the drafter's cache
    (`EagleProposer.prefill`), so the drafter attends to it while drafting."""
    start_R = np.repeat([len(p) for p in self.prompts], self.group_size) - 1
    return mask * (np.arange(mask.shape[1])[None] >= start_R[:, None])

  def features(self, toks, mask, dcfg: DrafterConfig, progress: bool = True):
    """(features, final hidden) of the target over `toks` (`teacher_features`, `mask` marking
    their tokens), for the target layers `dcfg` reads: `[rows, width, ...]`, the columns that
    hold tokens (`width` <= `toks.shape[1]`; train on `toks[:, :width]`)."""
    name = f"features-{content_digest([self.key, list(dcfg.feature_layers)])}"
    if (got := self._read(name)) is not None:
      self.loaded.append("features")
      return got["features"], got.get("hidden", got["features"])
    feats, hidden = teacher_features(self.target, toks, dcfg, mask, progress=progress)
    self._write(name, {"features": feats, **({"hidden": hidden} if hidden is not feats else {})})
    return feats, hidden
