"""Supervised warm start of the `tiny` policy on the built-in task, shipped or cached per recipe.

`warm_start(config)` returns a trained model, first found of:
  1. the warm start shipped with the package (`SHIPPED_DIR`, a Hugging Face folder written by
     `save_pretrained` with the recipe that made it), when `config`'s recipe is that one;
  2. the cache, when a checkpoint made with the same model/task/training settings exists;
  3. training one (minutes on 2 CPU cores), stored in the cache,
so that `make demo` and every experiment get it without a manual step. `make warmstart` retrains
the shipped one (`ship`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from tqdm import tqdm

from tlt_jax import optim
from tlt_jax.checkpoint import Checkpointer, CheckpointError
from tlt_jax.errors import ConfigError
from tlt_jax.hashing import content_digest
from tlt_jax.models import Transformer, get_preset, init_model
from tlt_jax.models.pretrained import load_hf_folder, save_pretrained
from tlt_jax.models.tokenizer import CharTokenizer
from tlt_jax.models.transformer import PARAM_LAYOUT
from tlt_jax.paths import exclusive
from tlt_jax.tasks import arithmetic

LENGTH_BUCKETS = (64, 128, 256)
SHIPPED_DIR = os.path.join(os.path.dirname(__file__), "assets", "tiny_warmstart")
RECIPE_FILE = "recipe.json"


def default_cache_dir() -> str:
  """`$TLT_JAX_CACHE`, else `<repo>/.cache`."""
  return os.environ.get("TLT_JAX_CACHE",
                        os.path.join(os.path.dirname(os.path.dirname(__file__)), ".cache"))


def recipe(config: ml_collections.ConfigDict) -> dict:
  """What determines the trained weights: model, task (with its defaults: the split of its
  prompt space among them, since the SFT data is its training side), training settings and
  seed."""
  out = {k: config[k].to_dict() if hasattr(config[k], "to_dict") else config[k]
         for k in ("model", "train", "seed")}
  return dict(out, task=dataclasses.asdict(arithmetic.TaskConfig.from_dict(config.task)))


def _fingerprint(config: ml_collections.ConfigDict) -> str:
  """The cache key: the recipe and the parameter layout (orbax stores the layout as it is)."""
  return content_digest(dict(recipe(config), param_layout=PARAM_LAYOUT))


def cache_path(config: ml_collections.ConfigDict) -> str:
  """Where the warm start of `config` is cached (keyed by its recipe)."""
  root = config.get("cache_dir") or default_cache_dir()
  return os.path.join(root, "warmstart", f"{config.model}-{_fingerprint(config)}")


def validate(config: ml_collections.ConfigDict, key: str = "config") -> None:
  """Clear errors for bad SFT settings, before any work (`key`: where the recipe sits in the
  launcher's config, for the messages)."""
  get_preset(config.model)
  arithmetic.TaskConfig.from_dict(config.task)
  t = config.train
  for name in ("steps", "tokens_per_batch"):
    if int(t[name]) < 1:
      raise ConfigError(f"{key}.train.{name} must be >= 1, got {t[name]}.")
  if not t.lr > 0:
    raise ConfigError(f"{key}.train.lr must be > 0, got {t.lr}.")
  if t.tokens_per_batch < LENGTH_BUCKETS[-1]:
    raise ConfigError(f"{key}.train.tokens_per_batch must be >= {LENGTH_BUCKETS[-1]}.")


def _bucket_batches(problems, tok, tokens_per_batch: int, rng: np.random.Generator):
  """Endless batches of (tokens, loss mask), each padded to one of `LENGTH_BUCKETS`."""
  seqs, masks = [], []
  for p in problems:
    prompt = arithmetic.encode_prompt(tok, p)
    sol = arithmetic.encode_solution(tok, p)
    seqs.append(prompt + sol)
    masks.append([0] * len(prompt) + [1] * len(sol))
  lens = np.array([len(s) for s in seqs])
  if lens.max() > LENGTH_BUCKETS[-1]:
    raise ValueError(f"A task sequence of {lens.max()} tokens exceeds {LENGTH_BUCKETS[-1]}.")
  bucket_of = np.searchsorted(LENGTH_BUCKETS, lens)
  members = [np.flatnonzero(bucket_of == b) for b in range(len(LENGTH_BUCKETS))]
  weights = np.array([lens[m].sum() for m in members], np.float64)
  weights /= weights.sum()
  while True:
    b = rng.choice(len(LENGTH_BUCKETS), p=weights)
    length = LENGTH_BUCKETS[b]
    rows = rng.choice(members[b], size=tokens_per_batch // length)
    x = np.zeros((len(rows), length), np.int32)
    m = np.zeros((len(rows), length), np.float32)
    for r, i in enumerate(rows):
      x[r, : lens[i]] = seqs[i]
      m[r, : lens[i]] = masks[i]
    yield x, m


def next_token_loss(model: Transformer, tokens_BxT, mask_BxT):
  """Mean cross-entropy of predicting `tokens[t+1]` where `mask[t+1]` is set."""
  logits = model(tokens_BxT[:, :-1]).logits_BxTxV
  logp = jax.nn.log_softmax(logits, axis=-1)
  nll_BxT = -jnp.take_along_axis(logp, tokens_BxT[:, 1:, None], axis=-1)[..., 0]
  m = mask_BxT[:, 1:]
  return jnp.sum(nll_BxT * m) / jnp.maximum(jnp.sum(m), 1.0)


def make_optimizer(train: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """AdamW for the SFT recipe `train`."""
  return optim.adamw(train.lr, warmup_steps=train.warmup_steps, total_steps=train.steps, b2=0.98,
                     weight_decay=train.weight_decay, clip=train.clip)


def training_problems(config: ml_collections.ConfigDict) -> list[arithmetic.Problem]:
  """The SFT data: `train.num_problems` problems from the training side of the task's prompt
  space, in a flatter difficulty mix than evaluation's (`train.task_alpha`) so that the policy
  sees enough multi-step chains to learn to carry a running total."""
  task = arithmetic.TaskConfig.from_dict(config.task)
  train_task = dataclasses.replace(task, alpha=config.train.get("task_alpha", task.alpha))
  return arithmetic.make_problems(config.train.num_problems, train_task, config.seed, "train")


def train(config: ml_collections.ConfigDict, progress: bool = True) -> tuple[Transformer, dict]:
  """Trains the policy from scratch; returns the model and a summary."""
  validate(config)
  cfg = get_preset(config.model)
  tok = CharTokenizer(cfg.vocab_size)
  model = init_model(cfg, seed=config.seed)
  graphdef, params = nnx.split(model, nnx.Param)
  opt = make_optimizer(config.train)
  opt_state = opt.init(params)

  @jax.jit
  def step(params, opt_state, x, m):
    def loss_fn(p):
      return next_token_loss(nnx.merge(graphdef, p), x, m)
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  batches = _bucket_batches(training_problems(config), tok, config.train.tokens_per_batch,
                            np.random.default_rng(config.seed))
  start, losses = time.time(), []
  bar = tqdm(range(config.train.steps), desc="sft", disable=not progress, mininterval=2.0)
  for _ in bar:
    x, m = next(batches)
    params, opt_state, loss = step(params, opt_state, jnp.asarray(x), jnp.asarray(m))
    losses.append(loss)
    if len(losses) % 50 == 0:
      last = float(losses[-1])
      if not np.isfinite(last):
        raise FloatingPointError(f"SFT loss became {last} at step {len(losses)}; lower "
                                 "config.train.lr or raise config.train.warmup_steps.")
      bar.set_postfix(loss=f"{last:.3f}")
  first = float(np.mean([float(l) for l in losses[:5]]))
  final = float(np.mean([float(l) for l in losses[-20:]]))
  return nnx.merge(graphdef, params), {"sft_loss_first": first, "sft_loss": final,
                                        "sft_seconds": time.time() - start,
                                        "sft_steps": int(config.train.steps)}


def ship(config: ml_collections.ConfigDict, directory: str = SHIPPED_DIR,
         progress: bool = True) -> dict:
  """Trains `config`'s warm start from scratch and writes it to `directory` as the shipped one:
  a Hugging Face folder (layout-independent) plus the recipe and the command that made it."""
  model, summary = train(config, progress=progress)
  save_pretrained(model, CharTokenizer(model.cfg.vocab_size), directory)
  with open(os.path.join(directory, RECIPE_FILE), "w") as f:
    json.dump({"recipe": recipe(config), "recipe_digest": content_digest(recipe(config)),
               "summary": summary, "command": "make warmstart"}, f, indent=2, sort_keys=True)
  return dict(summary, cache=directory)


def load_shipped(config: ml_collections.ConfigDict,
                 directory: str = SHIPPED_DIR) -> tuple[Transformer, dict] | None:
  """The shipped warm start if it was made with `config`'s recipe, else None."""
  path = os.path.join(directory, RECIPE_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    meta = json.load(f)
  if meta.get("recipe_digest") != content_digest(recipe(config)):
    return None
  loaded, _ = load_hf_folder(directory)
  graphdef = nnx.graphdef(nnx.eval_shape(lambda: init_model(get_preset(config.model), seed=0)))
  try:  # the preset's own config (and so its fingerprints), with the shipped weights
    model = nnx.merge(graphdef, nnx.state(loaded))
  except Exception as e:
    raise CheckpointError(f"The shipped warm start in {directory} does not fit the "
                          f"{config.model!r} preset ({e}); regenerate it with `make warmstart`."
                          ) from e
  return model, dict(meta["summary"], cache=directory, cached=True, shipped=True)


def warm_start(config: ml_collections.ConfigDict,
               progress: bool = True) -> tuple[Transformer, dict]:
  """The warm-started policy for `config`: shipped, cached, or trained and cached."""
  validate(config)
  shipped = load_shipped(config)
  if shipped is not None:
    return shipped
  path = cache_path(config)
  with exclusive(path):  # another process training the same warm start: wait, then load it
    ckpt = Checkpointer(path, keep=1, local=True)
    if ckpt.latest_step() is not None:
      abstract = nnx.eval_shape(lambda: init_model(get_preset(config.model), seed=config.seed))
      graphdef, abstract_params = nnx.split(abstract, nnx.Param)
      try:
        params, meta, _ = ckpt.restore(abstract_params)
        return nnx.merge(graphdef, params), dict(meta, cache=path, cached=True)
      except CheckpointError as e:
        raise CheckpointError(f"{e}\nThe warm-start cache at {path} is damaged: delete that "
                              "directory and it will be re-created.") from e
    model, summary = train(config, progress=progress)
    ckpt.save(int(config.train.steps), nnx.state(model, nnx.Param), summary)
    ckpt.wait()
  return model, dict(summary, cache=path, cached=False)
