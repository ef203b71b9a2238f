"""EAGLE-style drafter: one decoder layer over `fc(concat(embed(x_{t+1}), features_t))`.

Three layouts (`DrafterConfig.architecture`): "tlt", `fc` with a bias, then a whole pre-norm
decoder layer, then an output RMSNorm before the head; "eagle", exactly the EAGLE-1 drafter that
vLLM (`model_executor/models/llama_eagle.py`) and SGLang serve: `fc` without a bias, the layer's
input norm skipped (attention reads `fc`'s output), no output norm (the head reads the layer's
output); "eagle3", exactly the EAGLE-3 drafter of the `speculators` library (its `Eagle3DraftModel`,
which vLLM serves): the fused target layers projected by `fc` (no bias; ours `feat_proj`), a
midlayer whose attention reads the normed embedding beside the normed feature (2D wide) and whose
residual is the feature, and a normed head over the draft vocabulary; deeper steps read the
midlayer's output before that norm (`Eagle3Layer`).

`features_t` is the target's final hidden state at position t (EAGLE), or, for the EAGLE-3-style
variant, the concatenation of the target's hidden states at several layers (`feature_layers`,
e.g. low/mid/high). The drafter's output `g_t` approximates the target's final hidden state at
t + 1, and its logits are the target's own LM head applied to `g_t`: the embedding and the head
are the current policy's, shared and frozen (they are passed in, never copied), so the drafter
always speaks the policy's vocabulary. Deeper draft steps feed the drafter its own `g` as the
feature of the previous position. The drafter has its own static-shape KV cache.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from tlt_jax.kernels.attention import attention, to_cache_layout
from tlt_jax.models import kv_cache as kvc
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.kv_cache import KVCache, init_cache
from tlt_jax.models.layers import MLP, Attention, RMSNorm
from tlt_jax.models.transformer import Block


ARCHITECTURES = ("tlt", "eagle", "eagle3")


@dataclasses.dataclass(frozen=True)
class DrafterConfig:
  """`feature_layers` empty: EAGLE (final hidden); else EAGLE-3 fusion of those target layers.

  `draft_vocab` > 0 restricts the draft head to that many tokens (EAGLE-3's trick: the head is
  most of a small drafter's cost). The warm-up picks the tokens most frequent in the target's
  own rollouts and stores them, sorted, in `vocab_ids`; drafts are then always among them, and
  verification keeps decoding exact whatever the drafter proposes.

  `unroll_steps` > 1 trains draft depths 2.. as they run (EAGLE-3's training-time test): depth j
  reads the drafter's own output of depth j - 1 instead of the target's feature and attends as
  the drafter's cache does at that depth (`Drafter.teacher_step`); depth j's loss weighs
  `unroll_decay ** (j - 1)`. With 1, every position is teacher-forced (EAGLE, TLT).

  The soft labels are the target's distribution at `label_temperature` (the rollout's
  temperature: the distribution drafts are verified against), and the drafter's at the same
  temperature; `tv_weight` adds their total-variation distance, one minus the probability that
  the rejection rule accepts the draft (an acceptance-targeted loss). `accept_weighting` weighs
  depth j at index t by the probability (detached) that depths 1 .. j - 1 of a chain drafted
  from t were accepted, so that depths which are rarely reached matter less.
  """

  feature_layers: tuple[int, ...] = ()
  architecture: str = "tlt"      # "tlt" | "eagle" (EAGLE-1, vLLM / SGLang) | "eagle3" (speculators)
  smooth_l1_weight: float = 1.0  # the loss on the predicted next feature
  ce_weight: float = 0.1         # the loss on the next token (soft labels)
  draft_vocab: int = 0
  vocab_ids: tuple[int, ...] = ()
  unroll_steps: int = 1
  unroll_decay: float = 1.0      # each deeper unrolled depth's loss weight, times this
  label_temperature: float = 1.0
  tv_weight: float = 0.0
  accept_weighting: bool = False

  def __post_init__(self):
    if self.architecture not in ARCHITECTURES:
      raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {self.architecture!r}.")
    if self.architecture == "eagle" and self.feature_layers:
      raise ValueError("The 'eagle' (EAGLE-1) architecture reads the target's final hidden state: "
                       "leave feature_layers empty.")
    if self.architecture == "eagle3" and not self.feature_layers:
      raise ValueError("The 'eagle3' architecture reads fused target layers: set feature_layers "
                       "(EAGLE-3 takes three, low, middle and high).")
    if self.unroll_steps < 1:
      raise ValueError(f"unroll_steps must be >= 1 (1: teacher-forced only), got "
                       f"{self.unroll_steps}.")
    if not self.unroll_decay > 0:
      raise ValueError(f"unroll_decay must be > 0, got {self.unroll_decay}.")
    if not self.label_temperature > 0:
      raise ValueError(f"label_temperature must be > 0 (the rollout's temperature), got "
                       f"{self.label_temperature}.")
    if self.tv_weight < 0:
      raise ValueError(f"tv_weight must be >= 0, got {self.tv_weight}.")
    if self.draft_vocab < 0:
      raise ValueError(f"draft_vocab must be >= 0 (0: the full vocabulary), got "
                       f"{self.draft_vocab}.")
    if list(self.vocab_ids) != sorted(set(self.vocab_ids)):
      raise ValueError("DrafterConfig.vocab_ids must be distinct token ids in increasing order.")

  def n_features(self) -> int:
    """How many target layers the drafter's input fuses (1 without EAGLE-3 features)."""
    return max(1, len(self.feature_layers))

  def __repr__(self):  # the vocabulary can be thousands of ids: show its size
    return (f"DrafterConfig(feature_layers={self.feature_layers}, architecture="
            f"{self.architecture!r}, smooth_l1_weight="
            f"{self.smooth_l1_weight}, ce_weight={self.ce_weight}, draft_vocab={self.draft_vocab}, "
            f"vocab_ids=<{len(self.vocab_ids)} ids>, unroll_steps={self.unroll_steps}, "
            f"unroll_decay={self.unroll_decay}, label_temperature={self.label_temperature}, "
            f"tv_weight={self.tv_weight}, accept_weighting={self.accept_weighting})")


def layer_config(target: ModelConfig) -> ModelConfig:
  """The drafter's decoder layer has the target's width, heads and RoPE; one layer."""
  return target.replace(n_layers=1)


class Eagle3Layer(nnx.Module):
  """EAGLE-3's midlayer (speculators' `Eagle3FirstLayerMixin` over a Llama or Qwen3 layer): q, k
  and v projected from `[input_norm(embedding), hidden_norm(feature)]` (2D wide), the attended
  values added to the feature as it came, then the SwiGLU block. Attribute names as `Block`'s, so
  the Hugging Face names map alike (`weights.hf_param_table`)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    pd = jnp.dtype(cfg.param_dtype)
    self.input_norm = RMSNorm(cfg.d_model, cfg.norm_eps, param_dtype=pd)
    self.hidden_norm = RMSNorm(cfg.d_model, cfg.norm_eps, param_dtype=pd)
    self.attn = Attention(cfg, rngs=rngs, in_features=2 * cfg.d_model)
    self.post_attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps, param_dtype=pd)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, emb_BxTxD, h_BxTxD, positions_BxT, mask_BxTxT, context=()):
    """The layer on T (embedding, feature) pairs, attending as `Block` does; returns the output
    and the new keys and values."""
    pair = jnp.concatenate([self.input_norm(emb_BxTxD), self.hidden_norm(h_BxTxD)], axis=-1)
    q, k, v = self.attn.qkv(pair, positions_BxT)
    x_BxTxD = h_BxTxD + self.attn.out(attention(q, k, v, mask_BxTxT, context))
    return x_BxTxD + self.mlp(self.post_attn_norm(x_BxTxD)), (k, v)


class Drafter(nnx.Module):
  """The EAGLE drafter: one decoder layer over `fc(concat(embed(x_{t+1}), h_t))` (or EAGLE-3's
  fused features of several target layers), drafting with the target's frozen embedding and
  head, optionally restricted to a draft vocabulary."""

  def __init__(self, target: ModelConfig, cfg: DrafterConfig, *, rngs: nnx.Rngs):
    self.target_cfg, self.cfg = target, cfg
    lc = layer_config(target)
    d = target.d_model
    kw = dict(rngs=rngs, kernel_init=nnx.initializers.normal(0.02),
              param_dtype=jnp.dtype(target.param_dtype), dtype=jnp.dtype(target.dtype))
    # EAGLE-3: fused low/mid/high features are first projected to the model width, so that deeper
    # draft steps can feed the drafter's own D-wide output in their place.
    self.feat_proj = (nnx.Linear(cfg.n_features() * d, d, use_bias=False, **kw)
                      if cfg.feature_layers else None)
    tlt, eagle3 = cfg.architecture == "tlt", cfg.architecture == "eagle3"
    self.fc = None if eagle3 else nnx.Linear(2 * d, d, use_bias=tlt, **kw)
    self.layer = Eagle3Layer(lc, rngs=rngs) if eagle3 else Block(lc, rngs=rngs, input_norm=tlt)
    self.norm = (RMSNorm(d, target.norm_eps, param_dtype=jnp.dtype(target.param_dtype))
                 if tlt or eagle3 else None)

  @property
  def restricted(self) -> bool:
    """Whether the draft head covers a restricted vocabulary (`vocab_ids`)."""
    return bool(self.cfg.vocab_ids)

  @property
  def input_dtype(self):
    """The dtype the drafter's input layer computes in (None: its inputs')."""
    return self.layer.attn.qkv_proj.dtype if self.fc is None else self.fc.dtype

  def logits(self, target, g_BxTxD) -> jax.Array:
    """Draft logits `[B, T, R]` over the draft vocabulary (R = V unless restricted), through the
    target's own head ("eagle3": after the output norm, which its `g` has not had)."""
    if self.cfg.architecture == "eagle3":
      g_BxTxD = self.norm(g_BxTxD)
    return self.target_logits(target, g_BxTxD)

  def target_logits(self, target, hidden_BxTxD) -> jax.Array:
    """The target's head over the draft vocabulary on final hidden states `[B, T, D]` (the
    target's own, for its labels; none of the drafter's norms)."""
    rows_R = jnp.asarray(self.cfg.vocab_ids, jnp.int32) if self.restricted else None
    return target.head(hidden_BxTxD, rows_R)

  def token_ids(self, idx):
    """Draft-vocabulary indices to the target's token ids."""
    return jnp.asarray(self.cfg.vocab_ids, jnp.int32)[idx] if self.restricted else idx

  def on_vocab(self, x_xR, fill) -> jax.Array:
    """Values over the draft vocabulary spread to the target's `[..., V]` (others `fill`); the
    Gumbel noise or probabilities of a draft in the target's token space."""
    if not self.restricted:
      return x_xR
    full = jnp.full((*x_xR.shape[:-1], self.target_cfg.vocab_size), fill, x_xR.dtype)
    return full.at[..., jnp.asarray(self.cfg.vocab_ids, jnp.int32)].set(x_xR)

  def of_vocab(self, x_xV) -> jax.Array:
    """Target-vocabulary values `[..., V]` at the draft vocabulary's tokens `[..., R]`."""
    return x_xV[..., jnp.asarray(self.cfg.vocab_ids, jnp.int32)] if self.restricted else x_xV

  def project(self, feats_BxTxF) -> jax.Array:
    """Target features (`target_features`) to the D-wide input the drafter reads."""
    return feats_BxTxF if self.feat_proj is None else self.feat_proj(feats_BxTxF)

  def __call__(self, tok_emb_BxTxD, h_BxTxD, cache: KVCache | None = None, *,
               depth_T=None, tree_mask_TxT=None) -> tuple[jax.Array, KVCache | None]:
    """Drafter outputs `g` `[B, T, D]` (as the target's head reads them) from the next
    tokens' embeddings and the previous positions' D-wide features."""
    if cache is None:
      return self.teacher_step(tok_emb_BxTxD, h_BxTxD)[0], None
    b, t, _ = h_BxTxD.shape
    depth_T = jnp.arange(t) if depth_T is None else depth_T
    depth_BxT = depth_T if depth_T.ndim == 2 else depth_T[None, :]  # per-row trees
    positions = cache.lengths_B[:, None] + depth_BxT
    over_B = kvc.check_write(cache, t)
    x, (k, v) = self._layer(tok_emb_BxTxD, h_BxTxD, positions,
                            kvc.new_tokens_mask(b, t, tree_mask_TxT), cache.prefix(0))
    k_all, v_all = kvc.write_kv(cache, 0, k, v)
    cache = cache.replace(k=(k_all,), v=(v_all,), overflow_B=cache.overflow_B | over_B)
    return self.output(x), cache

  def teacher_step(self, tok_emb_BxTxD, h_BxTxD, depth: int = 1, context=()
                   ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """Draft depth `depth` (1-based) over whole sequences, for training.

    Index t reads its pair for this depth (the token `depth` places after t and, at depth 1, the
    target's feature at t, deeper the drafter's own output of the depth before) at position
    t + depth - 1, and attends exactly as the drafter's cache lets depth `depth` of a chain
    drafted from t attend: to depth 1's entries of indices <= t (`context[0]`), to depths
    2 .. depth - 1 at index t alone (the rest of `context`) and to itself. Returns `g` and this
    depth's keys and values in the cache layout, which extend `context` for the next depth.
    """
    b, t, _ = h_BxTxD.shape
    positions = jnp.broadcast_to(jnp.arange(t) + depth - 1, (b, t))
    causal = kvc.new_tokens_mask(b, t, None)
    own = jnp.broadcast_to(jnp.eye(t, dtype=bool), (b, t, t))
    segments = tuple((k, v, causal if i == 0 else own) for i, (k, v) in enumerate(context))
    x, (k, v) = self._layer(tok_emb_BxTxD, h_BxTxD, positions, causal if depth == 1 else own,
                            segments)
    return self.output(x), to_cache_layout(k, v)

  def _layer(self, tok_emb_BxTxD, h_BxTxD, positions_BxT, mask_BxTxT, context):
    """The decoder layer on (next token's embedding, feature) pairs."""
    if self.fc is None:  # EAGLE-3's midlayer reads the pair itself
      return self.layer(tok_emb_BxTxD, h_BxTxD, positions_BxT, mask_BxTxT, context)
    x = self.fc(jnp.concatenate([tok_emb_BxTxD, h_BxTxD], axis=-1))
    return self.layer(x, positions_BxT, mask_BxTxT, context)

  def output(self, x_BxTxD) -> jax.Array:
    """The layer's output `g`: normed ("tlt"), or as it is ("eagle"; "eagle3", whose head norms
    it in `logits`, while deeper steps read it unnormed)."""
    return self.norm(x_BxTxD) if self.cfg.architecture == "tlt" else x_BxTxD


def init_drafter(target: ModelConfig, cfg: DrafterConfig = DrafterConfig(), seed: int = 0
                 ) -> Drafter:
  """A drafter for `target` with freshly initialised weights."""
  return Drafter(target, cfg, rngs=nnx.Rngs(seed))


def drafter_cache(target: ModelConfig, batch: int, max_len: int, attention: str = "xla"
                  ) -> KVCache:
  """An empty one-layer KV cache for the drafter of `target` (`batch` rows, `max_len` slots)."""
  # The drafter's layer attends by `attention` in any numerics (its cache is never "invariant").
  return init_cache(layer_config(target).replace(numerics="fast"), batch, max_len, impl=attention)


def target_features(layers_hidden, final_hidden, cfg: DrafterConfig) -> jax.Array:
  """The features the drafter reads from a target forward (final hidden, or fused layers)."""
  if not cfg.feature_layers:
    return final_hidden
  return jnp.concatenate([layers_hidden[i] for i in cfg.feature_layers], axis=-1)
