"""Drafter training steps and the offline warm-up on the target's own rollouts.

The target is frozen: its weights enter as jit arguments (no gradient), only the drafter's
parameters are optimised (AdamW 0.9/0.95, weight decay 1e-2, clipping 1.0, as in TLT).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from tlt_jax import optim
from tlt_jax.drafter.losses import draft_vocab_mass, drafter_loss
from tlt_jax.drafter.model import Drafter, target_features
from tlt_jax.models.transformer import token_state, token_view


@dataclasses.dataclass(frozen=True)
class DrafterTrainConfig:
  """The drafter's optimizer: AdamW (b2 0.95) after clipping, with a linear warm-up.
  `decay_steps`: a training of known length (the offline warm-up) decays the rate by a cosine to
  a tenth at that step; 0 (the spot trainer, which has no end) keeps it constant."""

  lr: float = 3e-4            # the peak learning rate
  warmup_steps: int = 20      # linear warm-up steps to it
  weight_decay: float = 1e-2  # AdamW's
  clip: float = 1.0           # global gradient-norm clip
  decay_steps: int = 0

  def optimizer(self) -> optax.GradientTransformation:
    """AdamW with these settings."""
    return optim.adamw(self.lr, warmup_steps=self.warmup_steps, b2=0.95,
                       total_steps=self.decay_steps or None,
                       weight_decay=self.weight_decay, clip=self.clip)


def teacher_batch(target, tokens_BxL: np.ndarray, cfg) -> tuple[jax.Array, jax.Array]:
  """(features, final hidden) of a full target forward over the sequences."""
  out = target(jnp.asarray(tokens_BxL), return_layers=bool(cfg.feature_layers))
  return target_features(out.layers, out.hidden_BxTxD, cfg), out.hidden_BxTxD


@functools.lru_cache(maxsize=8)
def _programs(graphdef, target_graphdef, train_cfg: DrafterTrainConfig):
  """A drafter trainer's jitted step and evaluation, shared by every trainer of the same drafter
  and target structure and settings in a process: a trainer built again (a resumed run, a second
  run of one recipe) traces and compiles nothing that an earlier one did."""
  opt = train_cfg.optimizer()

  @jax.jit
  def update(params, opt_state, target_params, tokens, feats, hidden, mask):
    tgt = nnx.merge(target_graphdef, target_params)

    def loss_fn(p):
      return drafter_loss(nnx.merge(graphdef, p), tgt, tokens, feats, hidden, mask)
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, metrics

  @jax.jit
  def evaluate(params, target_params, tokens, feats, hidden, mask):
    tgt, drafter = nnx.merge(target_graphdef, target_params), nnx.merge(graphdef, params)
    metrics = drafter_loss(drafter, tgt, tokens, feats, hidden, mask)[1]
    if drafter.restricted:  # a full head: for held-out metrics, not every training step
      metrics["draft_vocab_mass"] = draft_vocab_mass(drafter, tgt, hidden, mask)
    return metrics

  return update, evaluate


class DrafterTrainer:
  """Owns the drafter's optimizer state and step count; `step` is one jitted update."""

  def __init__(self, drafter: Drafter, target,
               train_cfg: DrafterTrainConfig = DrafterTrainConfig()):
    self.graphdef, self.params = nnx.split(drafter, nnx.Param)
    # Of the target it reads the embedding and head alone (`models.transformer.token_view`).
    self.target_graphdef, self.target_params = nnx.split(token_view(target))
    self.opt = train_cfg.optimizer()
    self.opt_state = self.opt.init(self.params)
    self.step_count = 0
    self.feature_dtype = jnp.dtype(target.cfg.dtype)
    self._device = None
    # (params, opt_state, target_params, tokens, feats, hidden, mask) and (params,
    # target_params, tokens, feats, hidden, mask)
    self.update_fn, self.evaluate_fn = _programs(self.graphdef, self.target_graphdef, train_cfg)

  def set_target(self, target_params) -> None:
    """The policy changed: the shared embedding and head follow its new weights
    (`target_params`: the policy's parameter state, or that state's `token_state`)."""
    self.target_params = token_state(target_params)
    self._device = None

  def place(self, device) -> None:
    """Moves the drafter's state and the target weights it reads onto `device` (for spot training
    on whichever device is idle); a no-op when they are there already."""
    if self._device == device:
      return
    put = lambda t: jax.device_put(t, device)
    self.params, self.opt_state, self.target_params = (
        put(self.params), put(self.opt_state), put(self.target_params))
    self._device = device

  def step(self, tokens, feats, hidden, mask) -> dict:
    """One training step on a batch; returns its metrics (loss, top-1 agreement)."""
    self.params, self.opt_state, metrics = self.update_fn(
        self.params, self.opt_state, self.target_params, tokens, feats, hidden, mask)
    self.step_count += 1
    return {k: float(v) for k, v in metrics.items()}

  def metrics(self, tokens, feats, hidden, mask) -> dict:
    """The training step's metrics on a batch, without an update (a held-out batch); with a
    restricted draft vocabulary also the target's mass inside it (`draft_vocab_mass`)."""
    metrics = self.evaluate_fn(self.params, self.target_params, tokens, feats, hidden, mask)
    return {k: float(v) for k, v in metrics.items()}

  def drafter(self) -> Drafter:
    """The drafter with the current parameters."""
    return nnx.merge(self.graphdef, self.params)

  def state(self) -> dict:
    """Parameters, optimizer state and step count."""
    return {"params": self.params, "opt_state": self.opt_state,
            "step": jnp.int32(self.step_count)}

  def load_state(self, state: dict) -> None:
    """Restores what `state` returned."""
    self.params, self.opt_state = state["params"], state["opt_state"]
    self.step_count = int(state["step"])
    self._device = None
