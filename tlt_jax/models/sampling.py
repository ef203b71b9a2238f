"""The behaviour policy, defined once: processed distributions, addressed noise, Gumbel-max.

Every sampled token in the project (plain decoding, speculative verification, the trainer's
recomputation of log-probs) goes through `processed_logprobs`, so rollout log-probs and trainer
log-probs are the same quantity. The noise for sample `i` at response position `t` is
`fold_in(fold_in(key, i), t)`, so a token never depends on batch layout, bucket or strategy. A
sample may also be addressed by several words (`rollout/noise.py`: by its prompt), each folded
in turn.
Sampling is Gumbel-max over the processed log-probs, which makes the `coupled` verification rule
reproduce plain sampling token for token.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from tlt_jax.models import invariant

NEG_INF = -jnp.inf


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """Static sampling settings. temperature 0 is greedy; top_k 0 and top_p 1.0 are off."""

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  max_new_tokens: int = 128
  stop_tokens: tuple[int, ...] = ()

  def __post_init__(self):
    if self.temperature < 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature}.")
    if self.top_k < 0:
      raise ValueError(f"top_k must be >= 0 (0 is off), got {self.top_k}.")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p must be in (0, 1] (1 is off), got {self.top_p}.")
    if self.max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}.")

  @property
  def greedy(self) -> bool:
    """Whether sampling is greedy (temperature 0)."""
    return self.temperature == 0.0


def processed_logprobs(logits_xV: jax.Array, params: SamplingParams,
                       numerics: str = "fast") -> jax.Array:
  """Log-probs of the processed sampling distribution (temperature, top-k, top-p), float32.

  Tokens outside the top-k / top-p support get -inf. At temperature 0 this is the plain
  log-softmax (greedy decoding takes its argmax). With the model's `numerics` "invariant" each
  row is reduced in tiles of one shape (`invariant.row_map`), so a position's log-probs are the
  same in a decode step, a verify and the trainer's full forward.
  """
  if numerics == "invariant":
    flat_RxV = logits_xV.reshape(-1, logits_xV.shape[-1])
    return invariant.row_map(lambda x: _processed(x, params, _log_softmax_in_order),
                             flat_RxV).reshape(logits_xV.shape)
  return _processed(logits_xV, params)


def _log_softmax_in_order(x_xV: jax.Array) -> jax.Array:
  """`jax.nn.log_softmax` whose sum is a product with two columns of ones: a product runs in its
  kernel's order for its shape, where XLA orders a reduction by the fusion it puts it in (the
  update's gradient program fuses it otherwise than a rollout step does: ulps apart over a 49k
  vocabulary); one column would be a matrix-vector product, which XLA:CPU runs otherwise for
  few rows."""
  shifted = x_xV - jax.lax.stop_gradient(jnp.max(x_xV, axis=-1, keepdims=True))
  total = jnp.exp(shifted) @ jnp.ones((x_xV.shape[-1], 2), jnp.float32)
  return shifted - jnp.log(total[..., :1])


def _processed(logits_xV: jax.Array, params: SamplingParams,
               log_softmax=functools.partial(jax.nn.log_softmax, axis=-1)) -> jax.Array:
  logits = logits_xV.astype(jnp.float32)
  if params.greedy:
    return log_softmax(logits)
  logits = logits / params.temperature
  if params.top_k > 0 and params.top_k < logits.shape[-1]:
    kth = jax.lax.top_k(logits, params.top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, NEG_INF, logits)
  if params.top_p < 1.0:
    sorted_desc = -jnp.sort(-logits, axis=-1)
    probs = jax.nn.softmax(sorted_desc, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = mass_before < params.top_p  # the smallest prefix whose mass reaches top_p
    cutoff = jnp.min(jnp.where(keep, sorted_desc, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < cutoff, NEG_INF, logits)
  return log_softmax(logits)


def argmax(x: jax.Array, axis: int = -1) -> jax.Array:
  """`jnp.argmax` (the first index of the maximum) as two single-output reductions, which XLA
  vectorises: ~5x faster on CPU over a 49k vocabulary than its variadic (value, index) reduce,
  and every sampled token, verification and draft takes one. int32; x must not hold NaN."""
  m = jnp.max(x, axis=axis, keepdims=True)
  iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, axis % x.ndim)
  return jnp.min(jnp.where(x == m, iota, x.shape[axis]), axis=axis)


def noise_key(key: jax.Array, sample_id, position) -> jax.Array:
  """The key of sample `sample_id` (an id, or an address of one or more words) at response
  position `position`: one fold per word, but for the zero words that end an address after its
  first word (so `[i]` and `[i, 0, ..., 0]` are the same noise, whatever the address width: a
  held-out evaluation samples alike under either noise mode), then one for the position."""
  words = jnp.atleast_1d(jnp.asarray(sample_id))
  key = jax.random.fold_in(key, words[0])
  nonzero = words[1:] != 0
  # How many words after the first are folded: up to the last non-zero one.
  n = jnp.max(jnp.where(nonzero, jnp.arange(1, len(words)), 0), initial=0)
  for i in range(1, len(words)):
    key = jnp.where(i <= n, jax.random.fold_in(key, words[i]), key)
  return jax.random.fold_in(key, position)


def gumbel_noise(key: jax.Array, sample_ids_B: jax.Array, positions_B: jax.Array, vocab: int
                 ) -> jax.Array:
  """`[B, V]` Gumbel noise, each row drawn from its own addressed key."""
  keys = jax.vmap(noise_key, in_axes=(None, 0, 0))(key, sample_ids_B, positions_B)
  return jax.vmap(lambda k: jax.random.gumbel(k, (vocab,), jnp.float32))(keys)


def sample_from_logprobs(logp_BxV: jax.Array, params: SamplingParams, key: jax.Array,
                         sample_ids_B: jax.Array, positions_B: jax.Array) -> jax.Array:
  """Gumbel-max draw from processed log-probs (argmax when greedy)."""
  if params.greedy:
    return argmax(logp_BxV)
  g_BxV = gumbel_noise(key, sample_ids_B, positions_B, logp_BxV.shape[-1])
  return argmax(logp_BxV + g_BxV)


def sample(logits_BxV: jax.Array, params: SamplingParams, key: jax.Array, sample_ids_B: jax.Array,
           positions_B: jax.Array, numerics: str = "fast") -> tuple[jax.Array, jax.Array]:
  """Samples one token per row; returns `(tokens_B, logprob_B)` under the processed distribution
  (`numerics`: the model's, as `processed_logprobs` takes it)."""
  logp_BxV = processed_logprobs(logits_BxV, params, numerics)
  tokens_B = sample_from_logprobs(logp_BxV, params, key, sample_ids_B, positions_B)
  return tokens_B, jnp.take_along_axis(logp_BxV, tokens_B[:, None], axis=-1)[:, 0]
