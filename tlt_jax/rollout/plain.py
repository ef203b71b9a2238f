"""Plain full-batch decoding: one jitted prefill + `while_loop`, every row until the longest ends.

This is the reference that faster paths (compaction, speculative decoding) must equal token for
token, and the simple generator that evaluation uses.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tlt_jax.models import kv_cache as kvc
from tlt_jax.models.sampling import SamplingParams, sample


@dataclasses.dataclass
class Generation:
  """Responses `[B, max_new]` (padded with `pad_id` after the stop), their log-probs, lengths
  (stop token included) and whether each row stopped on a stop token (else: max length)."""

  tokens: np.ndarray
  logprobs: np.ndarray
  lengths: np.ndarray
  stopped: np.ndarray

  def response(self, i: int) -> list[int]:
    """Row `i`'s response tokens, up to its length."""
    return self.tokens[i, : self.lengths[i]].tolist()


def pad_prompts(prompts: list[list[int]], pad_to: int, pad_id: int = 0
                ) -> tuple[np.ndarray, np.ndarray]:
  """Right-pads token lists into `[B, pad_to]`; returns tokens and lengths."""
  lens = np.array([len(p) for p in prompts], np.int32)
  if lens.min(initial=1) < 1:
    raise ValueError("Every prompt needs at least one token (e.g. BOS).")
  if lens.max(initial=0) > pad_to:
    raise ValueError(f"A prompt of {lens.max()} tokens does not fit the prompt bucket {pad_to}.")
  out = np.full((len(prompts), pad_to), pad_id, np.int32)
  for i, p in enumerate(prompts):
    out[i, : len(p)] = p
  return out, lens


def prefill(model, cache: kvc.KVCache, prompts_BxP: jax.Array, lens_B: jax.Array):
  """Writes padded prompts into an empty cache; returns (last-token logits `[B, V]`, hidden
  `[B, D]`, cache). Rows commit only their own prompt length."""
  out = model(prompts_BxP, cache)
  cache = kvc.commit(out.cache, lens_B)
  last_B = lens_B - 1
  take = lambda x: jnp.take_along_axis(x, last_B[:, None, None], axis=1)[:, 0]
  return take(out.logits_BxTxV), take(out.hidden_BxTxD), cache


@functools.partial(jax.jit, static_argnames=("graphdef", "params", "cache_len", "pad_id"))
def _generate(graphdef, state, prompts_BxP, lens_B, key, sample_ids_B, *, params: SamplingParams,
              cache_len: int, pad_id: int):
  model = nnx.merge(graphdef, state)
  b = prompts_BxP.shape[0]
  n = params.max_new_tokens
  cache = kvc.init_cache(model.cfg, b, cache_len)
  logits_BxV, _, cache = prefill(model, cache, prompts_BxP, lens_B)
  stop_ids = jnp.array(params.stop_tokens or (-1,), jnp.int32)

  def body(carry):
    t, logits_BxV, cache, toks_BxN, logp_BxN, done_B, len_B = carry
    tok_B, lp_B = sample(logits_BxV, params, key, sample_ids_B, jnp.full((b,), t),
                        model.cfg.numerics)
    tok_B = jnp.where(done_B, pad_id, tok_B)
    toks_BxN = toks_BxN.at[:, t].set(tok_B)
    logp_BxN = logp_BxN.at[:, t].set(jnp.where(done_B, 0.0, lp_B))
    len_B = len_B + (~done_B)
    done_B = done_B | jnp.isin(tok_B, stop_ids)
    out = model(tok_B[:, None], cache)
    cache = kvc.commit(out.cache, jnp.ones((b,), jnp.int32))
    return t + 1, out.logits_BxTxV[:, 0], cache, toks_BxN, logp_BxN, done_B, len_B

  def cond(carry):
    t, *_, done_B, _ = carry
    return (t < n) & ~jnp.all(done_B)

  init = (jnp.int32(0), logits_BxV, cache, jnp.full((b, n), pad_id, jnp.int32),
          jnp.zeros((b, n), jnp.float32), jnp.zeros((b,), bool), jnp.zeros((b,), jnp.int32))
  _, _, cache, toks_BxN, logp_BxN, done_B, len_B = jax.lax.while_loop(cond, body, init)
  return toks_BxN, logp_BxN, len_B, done_B, cache.overflow_B


def generate_plain(model, prompts: list[list[int]], key: jax.Array, params: SamplingParams, *,
                   sample_ids: np.ndarray | None = None, prompt_bucket: int | None = None,
                   pad_id: int = 0) -> Generation:
  """Samples one response per prompt with the full batch decoding until every row stops."""
  graphdef, state = nnx.split(model)
  pad_to = prompt_bucket or max(len(p) for p in prompts)
  prompts_BxP, lens_B = pad_prompts(prompts, pad_to, pad_id)
  cache_len = pad_to + params.max_new_tokens
  if cache_len > model.cfg.max_seq_len:
    raise ValueError(f"Prompt bucket {pad_to} + max_new_tokens {params.max_new_tokens} exceeds the "
                     f"model context {model.cfg.max_seq_len}.")
  ids = np.arange(len(prompts)) if sample_ids is None else np.asarray(sample_ids)
  toks, logp, lens, done, overflow = _generate(
      graphdef, state, jnp.asarray(prompts_BxP), jnp.asarray(lens_B), key,
      jnp.asarray(ids, jnp.int32), params=params, cache_len=cache_len, pad_id=pad_id)
  if np.asarray(overflow).any():
    raise kvc.CacheOverflowError("KV cache overflow during plain generation.")
  return Generation(np.asarray(toks), np.asarray(logp), np.asarray(lens), np.asarray(done))
