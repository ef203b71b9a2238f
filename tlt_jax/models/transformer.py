"""The decoder every family runs on (`families/`): logits and hidden states, with or without a
KV cache."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from tlt_jax.kernels.attention import attention
from tlt_jax.models import invariant
from tlt_jax.models import kv_cache as kvc
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.layers import MLP, Attention, RMSNorm, dense

# Version of the parameter tree's names and shapes (2: fused q/k/v and gate/up kernels; 3: those
# kernels head-major, `[D, K, G + 2, H]` and `[D, 2, F]`). Caches keyed by it never hand a
# checkpoint of another layout to this code.
PARAM_LAYOUT = 3

# What a full forward's backward pass keeps of each layer (`Transformer.__call__`'s `remat`):
# "none" keeps every activation; "dots" keeps the weight matmuls' outputs and recomputes the
# rest (attention scores and probabilities, norms, the SwiGLU gate) layer by layer; "full" keeps
# each layer's input only and recomputes the layer.
REMAT_POLICIES = {"none": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
                  "full": jax.checkpoint_policies.nothing_saveable}


def _block_forward(block, x_BxTxD, positions_BxT, mask_BxTxT):
  """A layer of a full forward (no cache context): what `nnx.remat` wraps."""
  if block.attn.cfg.numerics == "invariant":
    return invariant.block(block, x_BxTxD, positions_BxT, mask_BxTxT, None, 0)
  return block(x_BxTxD, positions_BxT, mask_BxTxT)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ModelOutput:
  """Logits `[B, T, V]`, final (post-norm) hidden states `[B, T, D]`, the updated cache, and,
  when asked for, each layer's output `[B, T, D]` (index 0 is the embedding). A pytree, so a
  jitted forward can return it whole."""

  logits_BxTxV: jax.Array
  hidden_BxTxD: jax.Array
  cache: kvc.KVCache | None
  layers: tuple[jax.Array, ...] | None = None


class Block(nnx.Module):
  """Pre-norm decoder layer: attention then SwiGLU, each with a residual. `input_norm=False`:
  attention reads its input as it is (the layer of an EAGLE-1 drafter, whose input is `fc`'s)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, input_norm: bool = True):
    pd = jnp.dtype(cfg.param_dtype)
    self.input_norm = RMSNorm(cfg.d_model, cfg.norm_eps, param_dtype=pd) if input_norm else None
    self.attn = Attention(cfg, rngs=rngs)
    self.post_attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps, param_dtype=pd)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x_BxTxD, positions_BxT, mask_BxTxT, context=(), write=None):
    """The layer on T new tokens, which attend to each other as `mask_BxTxT` allows and to
    `context`: a decode call's cached prefix (`kernels.attention.Prefix`), or key/value
    segments of a full forward (`kernels.attention.attention`). Returns the output and the new
    keys and values `[B, T, K, H]`; with `write` (a cached prefix's `kv_cache.write_kv`), the
    cache's buffers with them written, which attention then reads the prefix from (its slots
    below each row's length are the same: `kv_cache.row_by_row` says which order XLA writes in
    place)."""
    normed = x_BxTxD if self.input_norm is None else self.input_norm(x_BxTxD)
    q, k, v = self.attn.qkv(normed, positions_BxT)
    kv = (k, v)
    if write is not None:
      kv = write(k, v)
      context = dataclasses.replace(context, k=kv[0], v_BxKxSxH=kv[1])
    x_BxTxD = x_BxTxD + self.attn.out(attention(q, k, v, mask_BxTxT, context))
    return x_BxTxD + self.mlp(self.post_attn_norm(x_BxTxD)), kv


class TokenIO(nnx.Module):
  """A model's token embedding and LM head (`embed`, and `lm_head` unless the embedding is tied):
  what a draft model reads of its target. A `Transformer` is one; `token_view` gives one that
  shares a model's two weights and holds nothing else, so that the drafter's training and checks
  move only those (`token_state` picks them from a model's state)."""

  def embed_tokens(self, tokens_BxT: jax.Array) -> jax.Array:
    """Token embeddings `[B, T, D]`."""
    return self.embed(tokens_BxT)

  def head(self, hidden_BxTxD: jax.Array, rows_R: jax.Array | None = None) -> jax.Array:
    """LM head on post-norm hidden states; float32 logits. With `rows_R` (token ids), only the
    logits of those tokens, in that order (a drafter's restricted vocabulary)."""
    if self.cfg.tie_embeddings:
      # The table as the left operand: a row-major matrix-vector product, ~2x faster on CPU at
      # small batch than `embed.attend` (hidden @ table.T).
      table_VxD = self.embed.embedding[...]
      if rows_R is not None:
        table_VxD = table_VxD[rows_R]
      table_VxD = table_VxD.astype(hidden_BxTxD.dtype)
      return jnp.einsum("vd,btd->btv", table_VxD, hidden_BxTxD,
                        preferred_element_type=jnp.float32)
    if rows_R is not None:
      kernel_DxR = self.lm_head.kernel[...][:, rows_R].astype(hidden_BxTxD.dtype)
      return jnp.einsum("btd,dr->btr", hidden_BxTxD, kernel_DxR,
                        preferred_element_type=jnp.float32)
    return jnp.tensordot(hidden_BxTxD, self.lm_head.kernel[...].astype(hidden_BxTxD.dtype), axes=1,
                         preferred_element_type=jnp.float32)


class Transformer(TokenIO):
  """Decoder-only language model. Call with a cache to decode, without for a full forward."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, param_dtype=jnp.dtype(cfg.param_dtype),
                           dtype=jnp.dtype(cfg.dtype), rngs=rngs,
                           embedding_init=nnx.initializers.normal(0.02))
    self.embed.embedding.set_metadata(axes=("vocab", "embed"))
    self.layers = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.n_layers)])
    self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps, param_dtype=jnp.dtype(cfg.param_dtype))
    if not cfg.tie_embeddings:
      self.lm_head = dense(rngs, cfg.d_model, cfg.vocab_size, ("embed", "vocab"), cfg)

  def __call__(self, tokens_BxT: jax.Array, cache: kvc.KVCache | None = None, *,
               positions_BxT: jax.Array | None = None, depth_T: jax.Array | None = None,
               tree_mask_TxT: jax.Array | None = None, attend_mask_BxT: jax.Array | None = None,
               return_layers: bool = False, remat: str = "none") -> ModelOutput:
    """Runs the model on `tokens_BxT`.

    Without a cache: a full causal forward at `positions_BxT` (default 0..T-1), where
    `attend_mask_BxT` can hide padding keys. With a cache: the T tokens are written at each row's
    next slots (uncommitted; see `kv_cache.commit`) at positions `lengths + depth_T` (default
    0..T-1), attending to the committed prefix and to each other as `tree_mask_TxT` allows
    (causal by default). `remat` (`REMAT_POLICIES`; a full forward only) trades the backward
    pass's memory for recomputation.
    """
    if remat not in REMAT_POLICIES or (remat != "none" and cache is not None):
      raise ValueError(f"remat must be one of {sorted(REMAT_POLICIES)} and 'none' with a cache, "
                       f"got {remat!r}.")
    b, t = tokens_BxT.shape
    x = self.embed_tokens(tokens_BxT)
    if cache is None:
      if positions_BxT is None:
        positions_BxT = jnp.broadcast_to(jnp.arange(t), (b, t))
      mask_BxTxT = kvc.new_tokens_mask(b, t, tree_mask_TxT)
      if attend_mask_BxT is not None:
        mask_BxTxT = mask_BxTxT & attend_mask_BxT[:, None, :]
      contexts = [()] * len(self.layers)
    else:
      depth_T = jnp.arange(t) if depth_T is None else depth_T
      depth_BxT = depth_T if depth_T.ndim == 2 else depth_T[None, :]  # per-row trees
      positions_BxT = cache.lengths_B[:, None] + depth_BxT
      over_B = kvc.check_write(cache, t)
      mask_BxTxT = kvc.new_tokens_mask(b, t, tree_mask_TxT)
      contexts = [cache.prefix(i) for i in range(len(self.layers))]

    layer_outs = [x] if return_layers else None
    new_k, new_v = [], []
    fixed_order = self.cfg.numerics == "invariant"
    forward = (nnx.remat(_block_forward, policy=REMAT_POLICIES[remat]) if remat != "none"
               else _block_forward if fixed_order and cache is None else None)
    first = (cache is not None and forward is None and not fixed_order  # write, then read
             and not kvc.row_by_row(cache))
    for i, (block, context) in enumerate(zip(self.layers, contexts)):
      if forward is not None:
        x, (k, v) = forward(block, x, positions_BxT, mask_BxTxT)
      elif fixed_order:  # the new keys and values come back written into the cache
        x, (k, v) = invariant.block(block, x, positions_BxT, mask_BxTxT, cache, i,
                                    tree=tree_mask_TxT is not None)
      else:
        x, (k, v) = block(x, positions_BxT, mask_BxTxT, context,
                          functools.partial(kvc.write_kv, cache, i) if first else None)
      if cache is not None:
        if not (fixed_order or first):
          k, v = kvc.write_kv(cache, i, k, v)
        new_k.append(k)
        new_v.append(v)
      if return_layers:
        layer_outs.append(x)
    if fixed_order:
      hidden, logits = invariant.head(self, x)
    else:
      hidden = self.final_norm(x)
      logits = self.head(hidden)
    if cache is not None:
      cache = cache.replace(k=tuple(new_k), v=tuple(new_v), overflow_B=cache.overflow_B | over_B)
    return ModelOutput(logits, hidden, cache, tuple(layer_outs) if return_layers else None)


class TokenView(TokenIO):
  """The `TokenIO` of a model, sharing its weights (`token_view`)."""

  def __init__(self, cfg: ModelConfig, embed: nnx.Embed, lm_head=None):
    self.cfg, self.embed = cfg, embed
    if lm_head is not None:
      self.lm_head = lm_head


def token_view(model: TokenIO) -> TokenView:
  """`model`'s embedding and head, as a module of their own (the same variables)."""
  return TokenView(model.cfg, model.embed, getattr(model, "lm_head", None))


def token_state(state) -> nnx.State:
  """The part of a model's parameter state (`nnx.state(model)`) that its `token_view` holds, in
  the structure `nnx.split(token_view(model))` gives (nested dicts under the state)."""
  plain = lambda x: {k: plain(v) for k, v in x.items()} if isinstance(x, nnx.State) else x
  return nnx.State({k: plain(state[k]) for k in ("embed", "lm_head") if k in state})


def init_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
  """A freshly initialised model."""
  return Transformer(cfg, rngs=nnx.Rngs(seed))


def abstract_model(cfg: ModelConfig) -> Transformer:
  """The model's structure with shape-only parameters (for restoring without allocating)."""
  return nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
