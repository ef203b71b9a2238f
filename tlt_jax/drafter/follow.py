"""The drafter's side of decoding: keeping its cache in step with the target, and drafting.

Invariant: with the target cache holding tokens `x_0 .. x_{L-1}`, the drafter cache holds the
`L - 1` pairs `(embed(x_{t+1}), features_t)` and `feat_BxF` is the target's feature at `L - 1`,
waiting for the next token. Plain steps, prefill and speculative steps all keep it, so speculation
can switch on at any step with a drafter that is already up to date (no re-prefill).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tlt_jax.drafter.model import Drafter, drafter_cache
from tlt_jax.models import kv_cache as kvc
from tlt_jax.models.sampling import SamplingParams, argmax, noise_key, processed_logprobs
from tlt_jax.spec import verify

# Pairs fed per iteration when a lazily-following drafter catches up; its cache has this many
# slots more than the target's, so that a window never writes past its end.
CATCH_UP_WINDOW = 64


def follow_cache(target_cfg, batch: int, cache_len: int, attention: str = "xla") -> kvc.KVCache:
  """The drafter cache that follows a target cache of `cache_len` slots."""
  return drafter_cache(target_cfg, batch, cache_len + CATCH_UP_WINDOW, attention)


def catch_up(drafter: Drafter, target, dcache: kvc.KVCache, feat_BxF, dnext_B, tokens_BxN,
             hidden_BxNxD, prompt_hidden_BxD, done_B, t_B):
  """Lazy following: feeds the drafter the pairs (response token j, feature before it) of the
  tokens emitted since it last read (`dnext_B` .. `t_B`), from the hidden states the decode
  state captured, `CATCH_UP_WINDOW` at a time, so that plain steps at large batch need not run
  the drafter. A no-op (one comparison) when no row is behind, as under eager following.
  Returns the new (dcache, feat_BxF, dnext_B)."""
  n, w = tokens_BxN.shape[1], CATCH_UP_WINDOW
  # before[j]: the target's feature before response token j (the prompt's last for j = 0).
  before_BxNxD = jnp.concatenate([prompt_hidden_BxD[:, None], hidden_BxNxD], axis=1)

  def behind(c):
    return jnp.any(~done_B & (c[2] < t_B))

  def feed(c):
    dcache, feat_BxF, dnext_B = c
    n_B = jnp.where(done_B, 0, jnp.clip(t_B - dnext_B, 0, w))
    idx_BxW = jnp.minimum(dnext_B[:, None] + jnp.arange(w)[None], n - 1)
    toks = jnp.take_along_axis(tokens_BxN, idx_BxW, axis=1)
    feats = jnp.take_along_axis(before_BxNxD, idx_BxW[:, :, None], axis=1).astype(feat_BxF.dtype)
    dcache = consume(drafter, target, dcache, toks, feats, n_B)
    dnext_B = dnext_B + n_B
    last_BxD = jnp.take_along_axis(before_BxNxD, jnp.minimum(dnext_B, n)[:, None, None], axis=1)
    return dcache, jnp.where((n_B > 0)[:, None], last_BxD[:, 0].astype(feat_BxF.dtype),
                             feat_BxF), dnext_B
  return jax.lax.while_loop(behind, feed, (dcache, feat_BxF, dnext_B))


def consume(drafter: Drafter, target, dcache: kvc.KVCache, next_tokens_BxT, feats_BxTxF,
            n_keep_B) -> kvc.KVCache:
  """Feeds pairs (embed(next_tokens[t]), features[t]) and keeps the first `n_keep` of them."""
  _, dcache = drafter(target.embed_tokens(next_tokens_BxT), drafter.project(feats_BxTxF),
                      dcache)
  return kvc.commit(dcache, n_keep_B)


def draft_chain(drafter: Drafter, target, dcache: kvc.KVCache, s0_B, feat_BxF, k: int,
                params: SamplingParams, key, sample_ids_B, t0_B, rule: str, live_B):
  """Drafts `k` tokens after `s0`, feeding the drafter its own output as the next feature.

  Draft j sits at response position `t0 + 1 + j`. Under `coupled` it is the Gumbel-max sample of
  the drafter's processed distribution with that position's own noise (the target's), so a good
  drafter agrees with the target's sample; under `rejection` it is drawn with an independent
  stream and `q` (returned, `[B, k, V]`) is what it was drawn from; that stream is independent
  of the target's, so its noise covers the draft vocabulary alone. Returns the drafts, q, the
  `coupled` noise drawn at the drafts' positions (`[B, k, V]`, which the verify reuses; None
  otherwise) and the drafter cache with only the first pair (which used the target's true
  feature) committed.
  """
  b = s0_B.shape[0]
  # The feature fed is carried in the dtype the drafter's input layer computes in: the target's
  # feature and the drafter's own output may differ in dtype, and the layer casts either.
  as_input = lambda h: h.astype(drafter.input_dtype or h.dtype)

  def step(carry, j):
    cache, tok_B, h = carry
    g, cache = drafter(target.embed_tokens(tok_B[:, None]), h, cache)
    cache = kvc.commit(cache, jnp.ones((b,), jnp.int32))
    logq_BxR = processed_logprobs(drafter.logits(target, g)[:, 0], params)
    pos_B = t0_B + 1 + j
    noise_BxV = None
    if params.greedy:
      idx_B = argmax(logq_BxR)
    elif rule == "coupled":  # the target's own noise, in its token space
      v = target.cfg.vocab_size
      noise_BxV = jax.vmap(lambda i, t: jax.random.gumbel(noise_key(key, i, t), (v,),
                                                          jnp.float32))(sample_ids_B, pos_B)
      idx_B = argmax(logq_BxR + drafter.of_vocab(noise_BxV))
    else:
      r = logq_BxR.shape[-1]
      g_BxR = jax.vmap(lambda i, t: jax.random.gumbel(
          verify.stream_key(key, i, t, verify.DRAFT_STREAM), (r,), jnp.float32))(sample_ids_B,
                                                                                pos_B)
      idx_B = argmax(logq_BxR + g_BxR)
    tok_B = drafter.token_ids(idx_B).astype(jnp.int32)
    return (cache, tok_B, as_input(g)), (tok_B, drafter.on_vocab(jnp.exp(logq_BxR), 0.0), noise_BxV)

  # A loop, so that the program holds one copy of the drafter's step whatever `k` is.
  (cache, _, _), outs_K = jax.lax.scan(
      step, (dcache, s0_B, as_input(drafter.project(feat_BxF[:, None]))), jnp.arange(k))
  committed = cache.replace(lengths_B=dcache.lengths_B + live_B.astype(jnp.int32))
  rows = lambda x_K: None if x_K is None else jnp.moveaxis(x_K, 0, 1)
  return (*map(rows, outs_K), committed)


def tree_ancestors(parents_BxE, depth: int) -> jax.Array:
  """`[B, E, E]` mask: node j is node i or one of its ancestors (`parents[i]` = -1: a root)."""
  b, n = parents_BxE.shape
  par_BxExE = jax.nn.one_hot(parents_BxE, n, dtype=jnp.float32)  # -1: an all-zero row
  reach = jnp.broadcast_to(jnp.eye(n, dtype=jnp.float32), (b, n, n))
  anc = reach
  for _ in range(depth):
    reach = reach @ par_BxExE  # reach[i, j]: j is the next ancestor up
    anc = anc + reach
  return anc > 0


def draft_tree(drafter: Drafter, target, dcache: kvc.KVCache, s0_B, feat_BxF, *, depth: int,
               topk: int, nodes: int, params: SamplingParams, key, sample_ids_B, t0_B,
               rule: str, live_B):
  """Drafts an EAGLE-2 dynamic tree under the root `s0`, one drafter forward per level.

  Level 0 feeds the root; each level's `topk` children per expanded node are scored, and the
  `topk` best new nodes by cumulative score are expanded at the next level (the drafter re-reads
  the whole expanded tree with a tree mask, so nothing uncommitted must survive between calls).
  Children: under `coupled` the best of the drafter's distribution perturbed by the position's
  own Gumbel noise (the target's; its best child is the chain's draft) scored by the softmax of
  the perturbed logits; greedy, the drafter's top-k by probability; under `rejection`, `topk`
  i.i.d. draws from `q` on a separate stream, scored by `q`.

  Verified: the `nodes` best drafts by cumulative score (ancestors score at least as high, so
  the kept set is a tree); under `rejection` every drafted node, since recursive rejection is
  exact only for siblings that are i.i.d. draws, not the best of them.

  Returns (tokens `[B, 1 + M]` with the root first, validity `[B, 1 + M]`, parent node indices
  (root: -1), depths, ancestor mask `[B, 1 + M, 1 + M]`, q `[B, 1 + M, V]` or None, and the
  drafter cache with only the root's pair committed).
  """
  b, k = s0_B.shape[0], topk
  greedy = params.greedy
  fed_tok, fed_h = s0_B[:, None], drafter.project(feat_BxF[:, None])
  fed_par = jnp.full((b, 1), -1, jnp.int32)
  fed_depth = jnp.zeros((b, 1), jnp.int32)
  fed_cand = jnp.full((b, 1), -1, jnp.int32)      # candidate index of each expanded node
  fed_score = jnp.zeros((b, 1), jnp.float32)
  c_tok, c_par, c_depth, c_score, c_q = [], [], [], [], []
  n_cand, cache = 0, dcache
  for level in range(depth):
    n_fed = fed_tok.shape[1]
    g, cache = drafter(target.embed_tokens(fed_tok), fed_h, cache, depth_T=fed_depth,
                       tree_mask_TxT=tree_ancestors(fed_par, level))
    m = 1 if level == 0 else k                     # the nodes expanded at this level
    front = jnp.arange(n_fed - m, n_fed)
    logq_BxMxR = processed_logprobs(drafter.logits(target, g[:, n_fed - m:]), params)
    idx_BxMxK, score = _children(drafter, logq_BxMxR, front, k, target.cfg.vocab_size, greedy,
                                 rule, key, sample_ids_B, t0_B + 1 + level)
    tok = drafter.token_ids(idx_BxMxK).astype(jnp.int32).reshape(b, m * k)
    cum = (fed_score[:, n_fed - m:, None] + score).reshape(b, m * k)
    par = jnp.broadcast_to(front[None, :, None], (b, m, k)).reshape(b, m * k)
    c_tok.append(tok), c_par.append(par), c_score.append(cum)
    c_depth.append(jnp.full((b, m * k), level + 1, jnp.int32))
    if rule == "rejection" and not greedy:
      q_BxMxV = drafter.on_vocab(jnp.exp(logq_BxMxR), 0.0)
      c_q.append(jnp.repeat(q_BxMxV, k, axis=1))
    if level + 1 < depth:                          # expand the k best new nodes next
      best = jax.lax.top_k(cum, k)[1]
      take = lambda x: jnp.take_along_axis(x, best, axis=1)
      new_par = take(par)
      fed_tok = jnp.concatenate([fed_tok, take(tok)], axis=1)
      fed_h = jnp.concatenate([fed_h, jnp.take_along_axis(g, new_par[:, :, None], axis=1)], 1)
      fed_par = jnp.concatenate([fed_par, new_par], axis=1)
      fed_depth = jnp.concatenate([fed_depth, jnp.full((b, k), level + 1, jnp.int32)], axis=1)
      fed_cand = jnp.concatenate([fed_cand, n_cand + best.astype(jnp.int32)], axis=1)
      fed_score = jnp.concatenate([fed_score, take(cum)], axis=1)
    n_cand += m * k
  tokens, valid, parents, depths, q = _kept_tree(
      s0_B, c_tok, c_par, c_score, c_depth, c_q, fed_cand, n_cand,
      n_cand if rule == "rejection" and not greedy else nodes)
  committed = cache.replace(lengths_B=dcache.lengths_B + live_B.astype(jnp.int32))
  return tokens, valid, parents, depths, tree_ancestors(parents, depth), q, committed


def _children(drafter: Drafter, logq_BxMxR, front, k: int, v: int, greedy: bool, rule: str, key,
              sample_ids_B, pos_B):
  """The `k` children of each expanded node (draft-vocabulary indices `[B, M, K]`) and their
  scores: greedy, the drafter's top k; under `coupled`, the top k of the drafter's distribution
  perturbed by the position's own Gumbel noise (the target's), scored by the perturbed softmax;
  under `rejection`, k i.i.d. draws from q on the draft stream, scored by q."""
  if greedy or rule == "coupled":
    if greedy:
      rank = logq_BxMxR
    else:
      gum_BxV = jax.vmap(lambda i, t: jax.random.gumbel(noise_key(key, i, t), (v,)))(
          sample_ids_B, pos_B)
      rank = logq_BxMxR + drafter.of_vocab(gum_BxV)[:, None, :]
    top_BxMxK, idx_BxMxK = jax.lax.top_k(rank, k)
    return idx_BxMxK, (top_BxMxK if greedy
                       else top_BxMxK - jax.nn.logsumexp(rank, -1, keepdims=True))

  def draw(i, t, node, j):
    kk = jax.random.fold_in(verify.stream_key(key, i, t, verify.DRAFT_STREAM), node * k + j)
    return jax.random.gumbel(kk, (v,))
  gum = jax.vmap(lambda i, t: jax.vmap(lambda node: jax.vmap(
      lambda j: draw(i, t, node, j))(jnp.arange(k)))(front))(sample_ids_B, pos_B)
  idx_BxMxK = argmax(logq_BxMxR[:, :, None] + drafter.of_vocab(gum))
  return idx_BxMxK, jnp.take_along_axis(logq_BxMxR, idx_BxMxK, axis=-1)


def _kept_tree(s0_B, c_tok, c_par, c_score, c_depth, c_q, fed_cand, n_cand: int, n_keep: int):
  """The tree verified: the root, then the `n_keep` best of the `n_cand` drafted candidates by
  cumulative score (ancestors first on ties, kept in level order), with their parent node
  indices, validity, depths and, under `rejection`, what each was drawn from."""
  b = s0_B.shape[0]
  tok, par, score, dep = (jnp.concatenate(x, axis=1) for x in (c_tok, c_par, c_score, c_depth))
  if n_keep < n_cand:
    sel = jnp.sort(jax.lax.top_k(score - 1e-6 * dep, n_keep)[1], axis=1)
  else:
    sel = jnp.broadcast_to(jnp.arange(n_cand), (b, n_cand))
  rows = jnp.arange(b)[:, None]
  node_of = jnp.full((b, n_cand), -1, jnp.int32).at[rows, sel].set(1 + jnp.arange(n_keep))
  parent_cand = jnp.take_along_axis(fed_cand, jnp.take_along_axis(par, sel, axis=1), axis=1)
  parent_node = jnp.where(parent_cand < 0, 0,
                          jnp.take_along_axis(node_of, jnp.maximum(parent_cand, 0), axis=1))
  valid = jnp.concatenate([jnp.ones((b, 1), bool), parent_node >= 0], axis=1)
  parents = jnp.concatenate([jnp.full((b, 1), -1, jnp.int32), parent_node], axis=1)
  tokens = jnp.concatenate([s0_B[:, None], jnp.take_along_axis(tok, sel, axis=1)], axis=1)
  depths = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), jnp.take_along_axis(dep, sel, 1)], 1)
  q = None
  if c_q:
    q_sel = jnp.take_along_axis(jnp.concatenate(c_q, axis=1), sel[:, :, None], axis=1)
    q = jnp.concatenate([jnp.zeros_like(q_sel[:, :1]), q_sel], axis=1)
  return tokens, valid, parents, depths, q
