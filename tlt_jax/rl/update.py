"""The sharded policy update on a `(data, fsdp, tp)` mesh, for any learner (`rl.learner`).

Parameters and optimizer state are laid out by the weights' logical axes (`models/sharding.py`:
the width over `fsdp`, heads and MLP over `tp`); each micro-batch's rows are split over `data`
and `fsdp`; gradients are accumulated over length-sorted micro-batches, each
trimmed to the columns its rows use, so memory is bounded by one micro-batch and padding costs
little. The same code runs on 1 device and on a faked multi-device CPU mesh.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from tlt_jax import distributed, optim
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.errors import ConfigError
from tlt_jax.models.sharding import DATA, FSDP, TP, batch_sharding, check_tp, param_shardings
from tlt_jax.rl.grpo import token_logprobs
from tlt_jax.rl.learner import Learner


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """The policy's optimizer (`config.rl.optim`): AdamW after global-norm clipping, a linear
  warm-up then cosine decay to `end_lr_fraction` over `total_steps` optimizer steps (0: every
  optimizer step of the run, as `run_config` resolves it; an updater given 0 keeps the rate after
  its warm-up)."""

  lr: float = 1e-5            # the peak learning rate
  warmup_steps: int = 5       # linear warm-up optimizer steps to it
  total_steps: int = 0        # the schedule's optimizer steps (0: every one of the run's)
  end_lr_fraction: float = 0.1  # the rate at the end, as a share of lr
  weight_decay: float = 0.0   # AdamW's
  clip: float = 1.0           # global gradient-norm clip
  b1: float = 0.9             # AdamW's first-moment decay
  b2: float = 0.999           # AdamW's second-moment decay

  def __post_init__(self):
    checks = [(self.lr > 0, "lr must be > 0"),
              (self.warmup_steps >= 0, "warmup_steps must be >= 0"),
              (self.total_steps >= 0, "total_steps must be >= 0 (0: the run's)"),
              (0 <= self.end_lr_fraction <= 1, "end_lr_fraction must be in [0, 1]"),
              (self.weight_decay >= 0, "weight_decay must be >= 0"),
              (self.clip > 0, "clip must be > 0"),
              (0 <= self.b1 < 1 and 0 <= self.b2 < 1, "b1 and b2 must be in [0, 1)")]
    for ok, what in checks:
      if not ok:
        raise ValueError(f"{what}; got {self}.")

  def optimizer(self) -> optax.GradientTransformation:
    """AdamW with these settings."""
    return optim.adamw(self.lr, warmup_steps=self.warmup_steps,
                       total_steps=self.total_steps or None,
                       end_lr_fraction=self.end_lr_fraction, b1=self.b1, b2=self.b2,
                       weight_decay=self.weight_decay, clip=self.clip)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PolicyBatch:
  """One update's rows: full sequences `[R, L]` (prompt then response, padded), prompt lengths,
  response mask `[R, N]`, advantages `[R]`, behaviour log-probs `[R, N]`, reference log-probs.

  `old_logp_RxN=None` means the behaviour policy is the one being updated (one update per batch
  of its own rollouts): the ratio is then exactly 1 and the update takes the log-probs from its
  own forward pass instead of a separate one (`PolicyUpdater.update(..., with_logprobs=True)`
  returns them)."""

  tokens_RxL: jax.Array
  prompt_len_R: jax.Array
  mask_RxN: jax.Array
  adv_R: jax.Array
  old_logp_RxN: jax.Array | None
  ref_logp_RxN: jax.Array


class PolicyUpdater:
  """Holds the sharded policy parameters and optimizer state; `update(batch)` is one step.

  A step's rows are sorted by the columns they use (prompt plus response) and cut into
  `micro_batches` equal groups, or, with `max_tokens` > 0, into groups of at most that many
  tokens per device (`token_groups`); each group is trimmed to the smallest power-of-two width
  that holds its longest row, so short rows pay neither for the longest response's padding nor
  for the prompt bucket's. Gradients are accumulated group by group (one compiled function per
  width) with weights that make the sum equal the full batch's loss for every aggregation mode,
  then one optimizer step is applied.
  """

  def __init__(self, model, mesh, learner: Learner, optim: OptimConfig, params: SamplingParams,
               micro_batches: int = 1, remat: str = "none", max_tokens: int = 0):
    if micro_batches < 1 or max_tokens < 0:
      raise ValueError(f"micro_batches must be >= 1 and max_tokens >= 0, got {micro_batches} "
                       f"and {max_tokens}.")
    self.mesh, self.learner, self.sampling, self.micro = mesh, learner, params, micro_batches
    self.remat, self.max_tokens = remat, max_tokens
    self.batch_rows = 0  # a token-budget group's most rows: an update's rows, set by `warm_up`
    self.row_devices = mesh.shape.get(DATA, 1) * mesh.shape.get(FSDP, 1)
    check_tp(model.cfg, mesh.shape.get(TP, 1))
    self.graphdef, state = nnx.split(model, nnx.Param)
    self.param_sharding = param_shardings(state, mesh)
    self.params = jax.tree.map(distributed.put, state, self.param_sharding)
    # The frozen reference policy of the KL term: the starting parameters (arrays are immutable
    # and never donated, so no copy). None when kl_coef is 0: nothing kept, nothing computed.
    self.ref_params = self.params if learner.kl_coef > 0 else None
    self.opt = optim.optimizer()
    opt_shape = jax.eval_shape(self.opt.init, self.params)
    self.opt_sharding = param_shardings(opt_shape, mesh)
    self.opt_state = jax.jit(self.opt.init, out_shardings=self.opt_sharding)(self.params)
    self.step_count = 0
    rows2, rows1 = batch_sharding(mesh, 2), batch_sharding(mesh, 1)
    self._row_shardings = PolicyBatch(rows2, rows1, rows2, rows1, rows2, rows2)
    self._grad, self._apply, self._logprobs = _programs(
        self.graphdef, learner, params, remat, optim,
        *map(_Static, (self.param_sharding, self.opt_sharding, self._row_shardings)))

  def groups(self, tokens_RxL: np.ndarray, prompt_len_R: np.ndarray, mask_RxN: np.ndarray):
    """`[(rows, sequence width, response width, padded rows), ...]`: the micro-batches."""
    rows, n = mask_RxN.shape
    self._check_rows(rows, tokens_RxL.shape[1])
    used_R = np.asarray(prompt_len_R) + np.asarray(mask_RxN).sum(axis=1).astype(np.int64)
    if self.max_tokens:
      return [(idx, t, min(n, t), padded) for idx, t, padded in
              token_groups(used_R, self.max_tokens, tokens_RxL.shape[1], self.row_devices,
                           self.batch_rows or rows)]
    return [(idx, t, min(n, t), len(idx))
            for idx, t in length_groups(used_R, self.micro, tokens_RxL.shape[1])]

  def _check_rows(self, rows: int, width: int) -> None:
    if self.max_tokens:
      if self.max_tokens < width:
        raise ConfigError(f"train.max_tokens_per_micro_batch={self.max_tokens} holds no row of "
                          f"{width} tokens (the prompt bucket plus max_new_tokens); raise it to "
                          f"at least {width}.")
      return
    devices = self.mesh.devices.size
    if rows % (self.micro * devices):
      raise ValueError(f"{rows} rows do not split into {self.micro} micro-batches over "
                       f"{devices} devices; use a multiple of {self.micro * devices}.")

  def gradient(self, mb: PolicyBatch, weight: float = 1.0, lower: bool = False):
    """`weight` x the gradient of one micro-batch `mb`'s loss at the current parameters, with
    its weighted metrics and log-probs, as `update` accumulates it; with `lower`, the lowered
    program instead (its compiled memory is what the memory plan's micro-batch parts bound)."""
    args = (self.params, jax.tree.map(jnp.zeros_like, self.params), self._put(mb),
            jnp.float32(weight))
    return self._grad.lower(*args) if lower else self._grad(*args)

  def _put(self, arrays: PolicyBatch) -> PolicyBatch:
    """Host rows (the same on every process) split over the mesh, which may span processes."""
    shardings = self._row_shardings
    if arrays.old_logp_RxN is None:  # on-policy: nothing to place there
      shardings = dataclasses.replace(shardings, old_logp_RxN=None)
    return jax.tree.map(distributed.put, arrays, shardings)

  def ref_logprobs(self, tokens_RxL, prompt_len_R, mask_RxN) -> np.ndarray:
    """Log-probs `[R, N]` of the responses under the frozen reference policy (the KL term's),
    with the same processed distribution; zeros when kl_coef is 0 (the term is off)."""
    if self.ref_params is None:
      return np.zeros(np.shape(mask_RxN), np.float32)
    return self.logprobs(tokens_RxL, prompt_len_R, mask_RxN, self.ref_params)[0]

  def logprobs(self, tokens_RxL, prompt_len_R, mask_RxN,
               params=None) -> tuple[np.ndarray, np.ndarray]:
    """Log-probs and entropies `[R, N]` of the responses (`mask_RxN` marks their tokens) under
    the current policy (or `params`), computed group by group as in the update (zeros past each
    group's response width, where the mask is zero too)."""
    params = self.params if params is None else params
    tokens, plen, mask = (np.asarray(x) for x in (tokens_RxL, prompt_len_R, mask_RxN))
    lp, ent = np.zeros(mask.shape, np.float32), np.zeros(mask.shape, np.float32)
    rows2, rows1 = self._row_shardings.tokens_RxL, self._row_shardings.prompt_len_R
    for idx, t, w, padded in self.groups(tokens, plen, mask):
      out = self._logprobs(params, distributed.put(_padded(tokens[idx, :t], padded), rows2),
                           distributed.put(_padded(plen[idx], padded), rows1), n=w)
      lp[idx, :w], ent[idx, :w] = (distributed.host(x)[:len(idx)] for x in out)
    return lp, ent

  def update(self, batch: PolicyBatch, with_logprobs: bool = False):
    """One optimizer step on `batch`; returns its metrics, and with `with_logprobs` also the
    responses' log-probs `[R, N]` under the parameters before the step (zeros past each group's
    response width, where the mask is zero too), as `logprobs` gives them."""
    b = jax.tree.map(np.asarray, batch)
    groups = self.groups(b.tokens_RxL, b.prompt_len_R, b.mask_RxN)
    rows, tokens = b.mask_RxN.shape[0], max(float(b.mask_RxN.sum()), 1.0)
    grads = jax.tree.map(jnp.zeros_like, self.params)
    metrics, logps = None, []
    for idx, t, w, padded in groups:
      old = None if b.old_logp_RxN is None else b.old_logp_RxN[idx, :w]
      mb = PolicyBatch(b.tokens_RxL[idx, :t], b.prompt_len_R[idx], b.mask_RxN[idx, :w],
                       b.adv_R[idx], old, b.ref_logp_RxN[idx, :w])
      mb = jax.tree.map(lambda x: _padded(x, padded), mb)  # rows without tokens weigh nothing
      # The padded row count: a mean over rows counts the empty rows, whose terms are zero.
      weight = self.learner.micro_weight(rows, tokens, padded, float(mb.mask_RxN.sum()))
      grads, m, logp = self._grad(self.params, grads, self._put(mb), jnp.float32(weight))
      metrics = m if metrics is None else jax.tree.map(jnp.add, metrics, m)
      logps.append((idx, w, logp))
    params, opt_state, grad_norm = self._apply(self.params, self.opt_state, grads)
    metrics = {k: float(v) for k, v in metrics.items()}
    metrics["grad_norm"] = float(grad_norm)
    bad = {k: v for k, v in metrics.items() if not np.isfinite(v)}
    if bad:  # the previous parameters are kept (not donated): nothing good is lost
      raise FloatingPointError(
          f"{self.learner.name.upper()} update {self.step_count + 1} produced non-finite {bad}; it "
          "was not applied. "
          "Lower the learning rate or check the rewards and advantages.")
    self.params, self.opt_state = params, opt_state
    self.step_count += 1
    if not with_logprobs:
      return metrics
    lp = np.zeros(b.mask_RxN.shape, np.float32)
    for idx, w, logp in logps:
      lp[idx, :w] = distributed.host(logp)[:len(idx)]
    return metrics, lp

  def model(self):
    """The policy with the current parameters."""
    return nnx.merge(self.graphdef, self.params)

  def local_model(self):
    """The policy with the current parameters whole on this process (every process takes part:
    an export's gather)."""
    return nnx.merge(self.graphdef, distributed.local_copy(self.params, self.mesh))

  def state(self) -> dict:
    """What a checkpoint keeps of the update (laid out over the update's mesh): `params`, `opt`
    (the optimizer state) and, with the KL term on, `ref_params`."""
    state = {"params": self.params, "opt": self.opt_state}
    if self.ref_params is not None:  # the KL term's reference survives a resume
      state["ref_params"] = self.ref_params
    return state

  def load_state(self, state: dict, step_count: int) -> None:
    """The update as `state()` was when `step_count` optimizer steps had been taken."""
    self.params, self.opt_state = state["params"], state["opt"]
    if "ref_params" in state:
      self.ref_params = state["ref_params"]
    self.step_count = step_count

  def warm_up(self, rows: int, prompt_width: int, n: int, off_policy: bool = False,
              shortest_prompt: int = 0) -> int:
    """Builds every program an `update` can run on batches of `rows` rows with prompts of at
    least `shortest_prompt` tokens padded to `prompt_width` and `n` response tokens: on-policy
    (`old_logp_RxN=None`) or, with `off_policy`, with behaviour log-probs given; each micro-batch
    width (`update_widths`: with a chat template's prompts, none of the narrow ones), the
    reference's log-probs when the KL term is on, the optimizer step and the eager ops around
    them. The narrowest width runs on zeros (its eager ops are every width's), the others are
    only compiled (running each would cost as much as an update's micro-batch: most of a small
    run's warm-up); nothing is applied. Returns the number of widths."""
    widths = update_widths(prompt_width + n, shortest=shortest_prompt)
    self._check_rows(rows, prompt_width + n)
    self.batch_rows = rows
    grads = jax.tree.map(jnp.zeros_like, self.params)
    for i, t in enumerate(widths):
      w = min(n, t)
      mb_rows = (budget_rows(self.max_tokens, t, self.row_devices, rows) if self.max_tokens
                 else rows // self.micro)
      zeros = lambda *shape: np.zeros(shape, np.float32)
      mb = PolicyBatch(np.zeros((mb_rows, t), np.int32),
                       np.ones(mb_rows, np.int32), zeros(mb_rows, w), zeros(mb_rows),
                       zeros(mb_rows, w) if off_policy else None, zeros(mb_rows, w))
      args = (self.params, grads, self._put(mb), jnp.float32(0.0))
      if self.ref_params is not None:
        ref_args = (self.ref_params,
                    distributed.put(mb.tokens_RxL, self._row_shardings.tokens_RxL),
                    distributed.put(mb.prompt_len_R, self._row_shardings.prompt_len_R))
        if i:
          self._logprobs.lower(*ref_args, n=w).compile()
        else:
          self._logprobs(*ref_args, n=w)
      if i == 0:
        grads, m, logp = self._grad(*args)
        jax.tree.map(jnp.add, m, m)  # as `update` sums the micro-batches' metrics
      else:  # a later call with these shapes and layouts finds this executable built
        logp = self._grad.lower(*args).compile().out_info[2]
        logp = distributed.put(np.zeros(logp.shape, logp.dtype), logp.sharding)
      distributed.host(logp)  # as `update` reads them back
    jax.block_until_ready(self._apply(self.params, self.opt_state, grads))
    return len(widths)


class _Static:
  """A pytree of shardings as a hashable key (its structure and leaves); `tree` gives it back."""

  def __init__(self, tree):
    leaves, self.treedef = jax.tree.flatten(tree)
    self.leaves = tuple(leaves)

  def __hash__(self):
    return hash((self.treedef, self.leaves))

  def __eq__(self, other):
    return (self.treedef, self.leaves) == (other.treedef, other.leaves)

  def tree(self):
    return jax.tree.unflatten(self.treedef, self.leaves)


@functools.lru_cache(maxsize=8)
def _programs(graphdef, learner: Learner, sampling: SamplingParams, remat: str,
              optim_cfg: OptimConfig, param_sharding: _Static, opt_sharding: _Static,
              row_shardings: _Static):
  """An update's jitted functions (one group's gradient, the optimizer step, log-probs by
  width), shared by every updater of the same model structure, settings and layouts in a process:
  an updater built again (a resumed run, a run beside its baseline) traces and compiles nothing
  that an earlier one did."""
  params_s, opt_s, rows_s = param_sharding.tree(), opt_sharding.tree(), row_shardings.tree()
  opt = optim_cfg.optimizer()

  def grad_fn(params, grads_acc, mb: PolicyBatch, weight):
    """`grads_acc` plus `weight` x the gradient of one group's loss; the weighted metrics; the
    group's log-probs `[R, N]` under `params`."""

    def loss_fn(p):
      model = nnx.merge(graphdef, p)
      logp, ent = token_logprobs(model, mb.tokens_RxL, mb.prompt_len_R, mb.mask_RxN.shape[1],
                                 sampling, remat)
      old = jax.lax.stop_gradient(logp) if mb.old_logp_RxN is None else mb.old_logp_RxN
      loss, metrics = learner.loss(logp, old, mb.adv_R, mb.mask_RxN, mb.ref_logp_RxN, ent)
      return loss, (metrics, logp)

    (_, (metrics, logp)), g = jax.value_and_grad(loss_fn, has_aux=True)(params)
    grads_acc = jax.tree.map(lambda a, b: a + weight * b, grads_acc, g)
    return grads_acc, jax.tree.map(lambda m: weight * m, metrics), logp

  def apply_fn(params, opt_state, grads):
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, optax.global_norm(grads)

  def logprobs_fn(params, tokens_RxL, prompt_len_R, n: int):
    return token_logprobs(nnx.merge(graphdef, params), tokens_RxL, prompt_len_R, n, sampling)

  grad = jax.jit(grad_fn, donate_argnums=1, in_shardings=(params_s, params_s, rows_s, None),
                 out_shardings=(params_s, None, rows_s.tokens_RxL))
  apply = jax.jit(apply_fn, in_shardings=(params_s, opt_s, params_s),
                  out_shardings=(params_s, opt_s, None))
  return grad, apply, jax.jit(logprobs_fn, static_argnames="n")  # one per width

def rollout_update(updater: PolicyUpdater, batch: PolicyBatch, logprobs_RxN: np.ndarray,
                   mini_batches: int, epochs: int, rng: np.random.Generator):
  """The update of one rollout batch: `epochs` passes, each over the rows shuffled by `rng` and
  cut into `mini_batches` (one optimizer step each). With one step in all it is on-policy: the
  ratio is 1 and the update's own forward gives the old log-probs; otherwise every step's ratio
  is taken against the rollout's recorded `logprobs_RxN`. Returns the learner's metrics averaged
  over the steps (with `optimizer_steps`) and the largest difference between the rollout's
  log-probs and the update's first forward over the response tokens."""
  mask = np.asarray(batch.mask_RxN)
  if mini_batches * epochs == 1:
    metrics, old = updater.update(batch, with_logprobs=True)
    return dict(metrics, optimizer_steps=1), float(np.max(np.abs(old - logprobs_RxN) * mask))
  b = dataclasses.replace(jax.tree.map(np.asarray, batch), old_logp_RxN=logprobs_RxN)
  steps, mismatch = [], 0.0
  for _ in range(epochs):
    for idx in np.split(rng.permutation(mask.shape[0]), mini_batches):
      mb = jax.tree.map(lambda x: x[idx], b)
      if steps:
        steps.append(updater.update(mb))
      else:
        m, first = updater.update(mb, with_logprobs=True)
        mismatch = float(np.max(np.abs(first - logprobs_RxN[idx]) * mask[idx]))
        steps.append(m)
  metrics = {k: float(np.mean([m[k] for m in steps])) for k in steps[0]}
  return dict(metrics, optimizer_steps=len(steps)), mismatch


def update_widths(width: int, min_width: int = 8, shortest: int = 0) -> list[int]:
  """Every sequence width `length_groups` and `token_groups` can give for rows of `width`
  columns of which each uses at least `shortest` (its prompt's length): none narrower than the
  shortest row's own group width."""
  widths, w = [], group_width(shortest, min_width, width)
  while w < width:
    widths.append(w)
    w *= 2
  return widths + [width]


def group_width(longest: int, min_width: int, width: int) -> int:
  """A micro-batch's sequence width: the smallest power of two (at least `min_width`) that holds
  its `longest` row, at most the rows' `width`."""
  return min(max(min_width, 1 << max(longest - 1, 0).bit_length()), width)


def budget_rows(max_tokens: int, width: int, devices: int, most: int) -> int:
  """The rows of a token-budget micro-batch of sequence `width`: as many per device as
  `max_tokens` holds (at least one), over `devices`, and no more than `most` rows need."""
  per_device = min(max(1, max_tokens // width), -(-most // devices))
  return per_device * devices


def token_groups(used_R: np.ndarray, max_tokens: int, width: int, devices: int, most: int,
                 min_width: int = 8):
  """Row indices, longest first, cut into micro-batches of at most `max_tokens` tokens per
  device: each takes the power-of-two width (at least `min_width`, at most `width`) of its
  longest row and `budget_rows` rows (the last group fewer): `[(rows, width, padded rows),
  ...]`, the padded rows being the group's shape, which depends on its width alone
  (`PolicyUpdater.warm_up` builds one per width)."""
  used_R = np.asarray(used_R, np.int64)
  order = np.argsort(-used_R, kind="stable")
  out, i = [], 0
  while i < len(order):
    w = group_width(int(used_R[order[i]]), min_width, width)
    padded = budget_rows(max_tokens, w, devices, most)
    idx = order[i:i + padded]
    out.append((np.sort(idx), w, padded))
    i += padded
  return out


def _padded(x: np.ndarray | None, rows: int):
  """`x` with zero rows appended up to `rows` (None stays None)."""
  if x is None or len(x) == rows:
    return x
  return np.concatenate([x, np.zeros((rows - len(x), *x.shape[1:]), x.dtype)])


def length_groups(used_R: np.ndarray, groups: int, width: int, min_width: int = 8):
  """Row indices sorted by the columns each row uses (`used_R`) and cut into `groups` equal
  parts, each with the smallest power-of-two width (at least `min_width`, at most `width`) that
  holds its longest row: `[(rows, width), ...]`. Powers of two bound the compiled widths to
  log2(width)."""
  used_R = np.asarray(used_R, np.int64)
  order = np.argsort(used_R, kind="stable")
  out = []
  for idx in np.split(order, groups):
    longest = int(used_R[idx].max()) if len(idx) else 0
    out.append((np.sort(idx), group_width(longest, min_width, width)))
  return out
