"""The drafter's side of decoding: keeping its cache in step with the target, and drafting.

Invariant: with the target cache holding tokens `x_0 .. x_{L-1}`, the drafter cache holds the
`L - 1` pairs `(embed(x_{t+1}), features_t)` and `feat_BxF` is the target's feature at `L - 1`,
waiting for the next token. Plain steps, prefill and speculative steps all keep it, so speculation
can switch on at any step with a drafter that is already up to date (no re-prefill).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tlt_jax.drafter.model import Drafter
from tlt_jax.models import kv_cache as kvc
from tlt_jax.rollout.sampling import SamplingParams, noise_key, processed_logprobs
from tlt_jax.spec import verify


def consume(drafter: Drafter, target, dcache: kvc.KVCache, next_tokens_BxT, feats_BxTxF,
            n_keep_B) -> kvc.KVCache:
  """Feeds pairs (embed(next_tokens[t]), features[t]) and keeps the first `n_keep` of them."""
  _, dcache = drafter(target.embed(next_tokens_BxT), drafter.project(feats_BxTxF), dcache)
  return kvc.commit(dcache, n_keep_B)


def draft_chain(drafter: Drafter, target, dcache: kvc.KVCache, s0_B, feat_BxF, k: int,
                params: SamplingParams, key, sample_ids_B, t0_B, rule: str, live_B):
  """Drafts `k` tokens after `s0`, feeding the drafter its own output as the next feature.

  Draft j sits at response position `t0 + 1 + j`. Under `coupled` it is the Gumbel-max sample of
  the drafter's processed distribution with that position's own noise (the target's), so a good
  drafter agrees with the target's sample; under `rejection` it is drawn with an independent
  stream and `q` (returned, `[B, k, V]`) is what it was drawn from. Returns the drafts, q, and the
  drafter cache with only the first pair (which used the target's true feature) committed.
  """
  b = s0_B.shape[0]
  cache, tok_B, h = dcache, s0_B, drafter.project(feat_BxF[:, None])
  drafts, qs = [], []
  for j in range(k):
    g, cache = drafter(target.embed(tok_B[:, None]), h, cache)
    cache = kvc.commit(cache, jnp.ones((b,), jnp.int32))
    logq_BxV = processed_logprobs(target.head(g)[:, 0], params)
    pos_B = t0_B + 1 + j
    v = logq_BxV.shape[-1]
    if params.greedy:
      tok_B = jnp.argmax(logq_BxV, axis=-1)
    else:
      stream = (lambda i, t: noise_key(key, i, t)) if rule == "coupled" else (
          lambda i, t: verify.stream_key(key, i, t, verify.DRAFT_STREAM))
      g_BxV = jax.vmap(lambda i, t: jax.random.gumbel(stream(i, t), (v,), jnp.float32))(
          sample_ids_B, pos_B)
      tok_B = jnp.argmax(logq_BxV + g_BxV, axis=-1)
    tok_B = tok_B.astype(jnp.int32)
    drafts.append(tok_B)
    qs.append(jnp.exp(logq_BxV))
    h = g
  committed = cache.replace(lengths_B=dcache.lengths_B + live_B.astype(jnp.int32))
  return jnp.stack(drafts, axis=1), jnp.stack(qs, axis=1), committed
