"""The sharded GRPO policy update on a `(data, fsdp)` mesh.

Parameters and optimizer state are laid out by the model's FSDP specs; the batch is split over
both mesh axes; gradients are accumulated over micro-batches inside one jitted step (a
`lax.scan`), so memory is bounded by one micro-batch. The same code runs on 1 device and on a
faked multi-device CPU mesh.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from tlt_jax.models.sharding import batch_sharding, param_shardings
from tlt_jax.rl.grpo import GRPOConfig, grpo_loss, token_logprobs
from tlt_jax.rollout.sampling import SamplingParams


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  lr: float = 1e-5
  warmup_steps: int = 5
  total_steps: int = 100
  end_lr_fraction: float = 0.1
  weight_decay: float = 0.0
  clip: float = 1.0
  b1: float = 0.9
  b2: float = 0.999

  def optimizer(self) -> optax.GradientTransformation:
    warmup = min(self.warmup_steps, max(self.total_steps - 1, 0))
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, self.lr, warmup, max(self.total_steps, warmup + 1), self.lr * self.end_lr_fraction)
    return optax.chain(optax.clip_by_global_norm(self.clip), optax.adamw(
        schedule, b1=self.b1, b2=self.b2, weight_decay=self.weight_decay))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PolicyBatch:
  """One update's rows: full sequences `[R, L]` (prompt then response, padded), prompt lengths,
  response mask `[R, N]`, advantages `[R]`, behaviour log-probs `[R, N]`, reference log-probs."""

  tokens_RxL: jax.Array
  prompt_len_R: jax.Array
  mask_RxN: jax.Array
  adv_R: jax.Array
  old_logp_RxN: jax.Array
  ref_logp_RxN: jax.Array


class PolicyUpdater:
  """Holds the sharded policy parameters and optimizer state; `update(batch)` is one step."""

  def __init__(self, model, mesh, grpo: GRPOConfig, optim: OptimConfig, params: SamplingParams,
               micro_batches: int = 1):
    self.mesh, self.grpo, self.sampling, self.micro = mesh, grpo, params, micro_batches
    self.graphdef, state = nnx.split(model, nnx.Param)
    self.param_sharding = param_shardings(state, mesh)
    self.params = jax.device_put(state, self.param_sharding)
    self.opt = optim.optimizer()
    opt_shape = jax.eval_shape(self.opt.init, self.params)
    self.opt_sharding = jax.tree.map(
        lambda x: NamedSharding(mesh, P()) if x.ndim == 0 else
        param_shardings(x, mesh), opt_shape)
    self.opt_state = jax.jit(self.opt.init, out_shardings=self.opt_sharding)(self.params)
    self.step_count = 0
    self._update = self._build_update()
    self._logprobs = jax.jit(self._logprobs_fn, static_argnames="n")  # compiled once per shape

  def _logprobs_fn(self, params, tokens_RxL, prompt_len_R, n: int):
    model = nnx.merge(self.graphdef, params)
    r, micro = tokens_RxL.shape[0], self.micro
    if micro == 1 or r % micro:
      return token_logprobs(model, tokens_RxL, prompt_len_R, n, self.sampling)
    chunks = (tokens_RxL.reshape(micro, r // micro, -1), prompt_len_R.reshape(micro, r // micro))
    lp, ent = jax.lax.map(lambda c: token_logprobs(model, c[0], c[1], n, self.sampling), chunks)
    return lp.reshape(r, n), ent.reshape(r, n)

  def logprobs(self, tokens_RxL, prompt_len_R, n: int):
    """Log-probs (and entropies) of the responses under the current policy, computed
    `micro_batches` rows at a time (the memory of one micro-batch, as in the update)."""
    return self._logprobs(self.params, tokens_RxL, prompt_len_R, n=n)

  def _build_update(self):
    graphdef, cfg, sampling, micro, opt = self.graphdef, self.grpo, self.sampling, self.micro, \
        self.opt

    def loss_fn(params, mb: PolicyBatch):
      model = nnx.merge(graphdef, params)
      n = mb.mask_RxN.shape[1]
      logp, ent = token_logprobs(model, mb.tokens_RxL, mb.prompt_len_R, n, sampling)
      return grpo_loss(logp, mb.old_logp_RxN, mb.adv_R, mb.mask_RxN, cfg, mb.ref_logp_RxN, ent)

    def update(params, opt_state, batch: PolicyBatch):
      split = jax.tree.map(lambda x: x.reshape(micro, x.shape[0] // micro, *x.shape[1:]), batch)

      def accumulate(carry, mb):
        grads, metrics = carry
        (_, m), g = jax.value_and_grad(loss_fn, has_aux=True)(params, mb)
        return (jax.tree.map(jnp.add, grads, g),
                jax.tree.map(jnp.add, metrics, m)), None

      zeros = jax.tree.map(jnp.zeros_like, params)
      m0 = jax.eval_shape(lambda: loss_fn(params, jax.tree.map(lambda x: x[0], split))[1])
      m0 = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), m0)
      (grads, metrics), _ = jax.lax.scan(accumulate, (zeros, m0), split)
      grads = jax.tree.map(lambda g: g / micro, grads)
      metrics = jax.tree.map(lambda m: m / micro, metrics)
      metrics["grad_norm"] = optax.global_norm(grads)
      updates, opt_state = opt.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, metrics

    batch_sh = lambda ndim: batch_sharding(self.mesh, ndim)
    batch_shardings = PolicyBatch(batch_sh(2), batch_sh(1), batch_sh(2), batch_sh(1), batch_sh(2),
                                  batch_sh(2))
    return jax.jit(update, in_shardings=(self.param_sharding, self.opt_sharding, batch_shardings),
                   out_shardings=(self.param_sharding, self.opt_sharding, None))

  def update(self, batch: PolicyBatch) -> dict:
    rows = batch.tokens_RxL.shape[0]
    devices = self.mesh.devices.size
    if rows % (self.micro * devices):
      raise ValueError(f"{rows} rows do not split into {self.micro} micro-batches over "
                       f"{devices} devices; use a multiple of {self.micro * devices}.")
    params, opt_state, metrics = self._update(self.params, self.opt_state, batch)
    metrics = {k: float(v) for k, v in metrics.items()}
    bad = {k: v for k, v in metrics.items() if not jnp.isfinite(v)}
    if bad:  # the previous parameters are kept (not donated): nothing good is lost
      raise FloatingPointError(
          f"GRPO update {self.step_count + 1} produced non-finite {bad}; it was not applied. "
          "Lower the learning rate or check the rewards and advantages.")
    self.params, self.opt_state = params, opt_state
    self.step_count += 1
    return metrics

  def model(self):
    return nnx.merge(self.graphdef, self.params)
