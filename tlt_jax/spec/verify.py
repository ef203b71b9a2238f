"""Exact verification of drafted tokens against the target's processed distribution.

A speculative step feeds `[s0, d1 .. dk]`: `s0` is the row's next token, sampled exactly as plain
decoding samples it, and `d1 .. dk` are drafts. The target logits at input `j` give `p_{j+1}`, the
distribution of the token after input `j`. Verification decides how many drafts to keep (`n_acc`)
and whether the next token is forced (a residual sample of the rejection rule). The logits of the
last kept input become the row's next-token logits, so the token after the kept ones is sampled by
the next step exactly as plain decoding would: the bonus token of speculative sampling.

Rules (greedy is the temperature-0 case of both):
- `coupled`: the target's token at response position `t` is the Gumbel-max sample under that
  position's own addressed noise (the same noise plain decoding uses); drafts are kept while they
  equal it. The output equals plain sampling token for token.
- `rejection`: speculative sampling. Keep `d` with probability `min(1, p(d) / q(d))`, where `q` is
  the distribution `d` was actually drawn from (a point mass for deterministic drafts); on the
  first rejection draw the next token from `norm(max(0, p - q))`. For trees, siblings are tried in
  order and each rejected sibling's mass is removed before the next (recursive rejection).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tlt_jax.models.sampling import argmax, noise_key

# Independent noise streams under a row's (sample, position) key.
ACCEPT_STREAM, RESIDUAL_STREAM, DRAFT_STREAM = 1, 2, 3


def stream_key(key, sample_id, position, stream: int):
  """The noise key of `sample_id` at `position` for the verification stream `stream`."""
  return jax.random.fold_in(noise_key(key, sample_id, position), stream)


def _gumbel(key_, vocab):
  return jax.random.gumbel(key_, (vocab,), jnp.float32)


def coupled_targets(logp_BxJxV, key, sample_ids_B, positions_BxJ, greedy: bool,
                    noise_BxJxV=None) -> jax.Array:
  """The target's own sample at each position: argmax(logp + Gumbel noise of that position);
  `noise_BxJxV`: that noise, already drawn (by the drafter)."""
  if greedy:
    return argmax(logp_BxJxV)
  if noise_BxJxV is not None:
    return argmax(logp_BxJxV + noise_BxJxV)
  v = logp_BxJxV.shape[-1]
  g = jax.vmap(jax.vmap(lambda i, t: _gumbel(noise_key(key, i, t), v), in_axes=(None, 0)))(
      sample_ids_B, positions_BxJ)
  return argmax(logp_BxJxV + g)


def verify_chain_coupled(logp_BxKxV, drafts_BxK, key, sample_ids_B, t0_B, greedy: bool,
                         noise_BxKxV=None):
  """Number of leading drafts equal to the target's samples. `logp_BxKxV[:, j]` is p_{j+1}, the
  distribution of draft j+1, which sits at response position `t0 + 1 + j` (`noise_BxKxV`: the
  noise of those positions, if the drafter drew it)."""
  k = drafts_BxK.shape[1]
  pos_BxK = t0_B[:, None] + 1 + jnp.arange(k)[None, :]
  target_BxK = coupled_targets(logp_BxKxV, key, sample_ids_B, pos_BxK, greedy, noise_BxKxV)
  match_BxK = drafts_BxK == target_BxK
  n_acc_B = jnp.sum(jnp.cumprod(match_BxK.astype(jnp.int32), axis=1), axis=1)
  return n_acc_B, jnp.full_like(n_acc_B, -1)


def _residual_sample(p_V, q_V, key_):
  """A draw from norm(max(0, p - q)) by Gumbel-max on its log."""
  r = jnp.maximum(p_V - q_V, 0.0)
  logr = jnp.where(r > 0, jnp.log(jnp.where(r > 0, r, 1.0)), -jnp.inf)
  return argmax(logr + _gumbel(key_, p_V.shape[-1]))


def verify_chain_rejection(logp_BxKxV, drafts_BxK, q_BxKxV, key, sample_ids_B, t0_B):
  """Speculative sampling over a chain. Returns (n_acc, forced next token or -1)."""
  k = drafts_BxK.shape[1]
  p = jnp.exp(logp_BxKxV)

  def row(p_KxV, q_KxV, d_K, i, t0):
    pos_K = t0 + 1 + jnp.arange(k)
    u_K = jax.vmap(lambda t: jax.random.uniform(stream_key(key, i, t, ACCEPT_STREAM)))(pos_K)
    pd = jnp.take_along_axis(p_KxV, d_K[:, None], axis=1)[:, 0]
    qd = jnp.take_along_axis(q_KxV, d_K[:, None], axis=1)[:, 0]
    ok_K = u_K * qd < pd  # u < p/q, and never when p(d) = 0
    n_acc = jnp.sum(jnp.cumprod(ok_K.astype(jnp.int32)))
    j = jnp.minimum(n_acc, k - 1)
    forced = _residual_sample(p_KxV[j], q_KxV[j], stream_key(key, i, t0 + 1 + j, RESIDUAL_STREAM))
    return n_acc, jnp.where(n_acc < k, forced, -1)

  return jax.vmap(row)(p, q_BxKxV, drafts_BxK, sample_ids_B, t0_B)


def point_mass(tokens, vocab: int) -> jax.Array:
  """q for deterministic drafts."""
  return jax.nn.one_hot(tokens, vocab, dtype=jnp.float32)


def verify_tree(logp_BxExV, tokens_BxE, parents_BxE, q_BxExV, key, sample_ids_B, t0_B, *,
                rule: str, greedy: bool, depth: int):
  """Walks a draft tree from its root (node 0 = s0). Node `n > 0` holds draft `tokens[n]` with
  parent `parents[n]`; `logp[:, n]` is the target's distribution after node n; `q[:, n]` is the
  distribution node n's token was drawn from. Children are tried in index order.

  Returns (path `[B, depth + 1]` of node indices starting at 0, n_acc, forced token or -1).
  """
  b, n, v = logp_BxExV.shape

  def row(logp_ExV, tok_E, par_E, q_ExV, i, t0):
    p_ExV = jnp.exp(logp_ExV)

    def level(carry, d):
      node, alive, n_acc, forced, path = carry
      pos = t0 + 1 + d
      children = (par_E == node) & (jnp.arange(n) > 0)
      if rule == "coupled" or greedy:
        if greedy:
          target = argmax(logp_ExV[node])
        else:
          target = argmax(logp_ExV[node] + _gumbel(noise_key(key, i, pos), v))
        hit = children & (tok_E == target)
        nxt = jnp.argmax(hit)
        ok = alive & jnp.any(hit)
        new_forced = forced
      else:
        # Recursive rejection: siblings in index order, each rejected sibling's q removed from p.
        def try_child(state, c):
          p_cur, chosen = state
          is_child = children[c] & (chosen < 0)
          u = jax.random.uniform(jax.random.fold_in(stream_key(key, i, pos, ACCEPT_STREAM), c))
          pc, qc = p_cur[tok_E[c]], q_ExV[c, tok_E[c]]
          accept = is_child & (u * qc < pc)
          p_next = jnp.where(is_child & ~accept, jnp.maximum(p_cur - q_ExV[c], 0.0), p_cur)
          p_next = p_next / jnp.maximum(jnp.sum(p_next), 1e-30)
          return (p_next, jnp.where(accept, c, chosen)), None
        (p_res, chosen), _ = jax.lax.scan(try_child, (p_ExV[node], jnp.int32(-1)), jnp.arange(n))
        ok = alive & (chosen >= 0)
        nxt = jnp.maximum(chosen, 0)
        res_tok = _residual_sample(p_res, jnp.zeros_like(p_res),
                                   stream_key(key, i, pos, RESIDUAL_STREAM))
        new_forced = jnp.where(alive & ~ok, res_tok, forced)
      node = jnp.where(ok, nxt, node)
      path = path.at[d + 1].set(jnp.where(ok, nxt, 0))
      return (node, ok, n_acc + ok, new_forced, path), None

    init = (jnp.int32(0), jnp.bool_(True), jnp.int32(0), jnp.int32(-1),
            jnp.zeros((depth + 1,), jnp.int32))
    (node, alive, n_acc, forced, path), _ = jax.lax.scan(level, init, jnp.arange(depth))
    return path, n_acc, forced

  return jax.vmap(row)(logp_BxExV, tokens_BxE, parents_BxE, q_BxExV, sample_ids_B, t0_B)
