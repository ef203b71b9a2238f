"""Transformer building blocks: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tlt_jax.models.config import ModelConfig


class RMSNorm(nnx.Module):
  """Root-mean-square norm with a learned scale, computed in float32."""

  def __init__(self, dim: int, eps: float, *, param_dtype=jnp.float32):
    self.scale = nnx.Param(jnp.ones((dim,), param_dtype))
    self.eps = eps

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (y * self.scale[...].astype(jnp.float32)).astype(x.dtype)


def apply_rope(x_BxTxNxH: jax.Array, positions_BxT: jax.Array, theta: float, layout: str
               ) -> jax.Array:
  """Rotary position embedding in the HF rotate-half or the GGUF interleaved-pair layout."""
  h = x_BxTxNxH.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, h, 2, dtype=jnp.float32) / h))
  angles_BxTxH2 = positions_BxT[..., None].astype(jnp.float32) * inv_freq
  cos = jnp.cos(angles_BxTxH2)[:, :, None, :]
  sin = jnp.sin(angles_BxTxH2)[:, :, None, :]
  x = x_BxTxNxH.astype(jnp.float32)
  if layout == "half":
    x1, x2 = x[..., : h // 2], x[..., h // 2:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  else:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = jnp.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).reshape(x.shape)
  return out.astype(x_BxTxNxH.dtype)


def attention(q_BxTxNxH, segments) -> jax.Array:
  """Grouped-query softmax attention over several key/value segments, as if concatenated: each
  is `(k [B, K, H, S], v [B, K, S, H], mask [B, T, S])` in the cache layout (e.g. the cached
  prefix, then the new tokens). Keeping the cache a separate segment means a decode step reads
  it before writing the new entries, so XLA updates it in place instead of copying it around
  the write. Each kv head serves N // K query heads."""
  b, t, n, h = q_BxTxNxH.shape
  kh = segments[0][0].shape[1]
  q_BxKxGTxH = q_BxTxNxH.reshape(b, t, kh, n // kh, h).transpose(0, 2, 3, 1, 4).reshape(
      b, kh, -1, h)
  scores = []
  for k_BxKxHxS, _, mask_BxTxS in segments:
    s = jnp.einsum("bkqh,bkhs->bkqs", q_BxKxGTxH, k_BxKxHxS,
                   preferred_element_type=jnp.float32) / jnp.sqrt(jnp.float32(h))
    # Additive, not `where`: a segment masked by a constant (an empty cache in a jitted prefill)
    # then stays data-dependent, which keeps XLA from constant-folding it (slow, at prefill size).
    bias_BxGTxS = jnp.tile(jnp.where(mask_BxTxS, 0.0, jnp.finfo(jnp.float32).min), (1, n // kh, 1))
    scores.append(s + bias_BxGTxS[:, None])
  sizes = [s.shape[-1] for s in scores]
  probs = jax.nn.softmax(jnp.concatenate(scores, axis=-1), axis=-1)
  out_BxKxGTxH = 0
  for (_, v_BxKxSxH, _), p in zip(segments, jnp.split(probs, np.cumsum(sizes)[:-1], axis=-1)):
    out_BxKxGTxH = out_BxKxGTxH + jnp.einsum("bkqs,bksh->bkqh", p.astype(v_BxKxSxH.dtype),
                                             v_BxKxSxH)
  return out_BxKxGTxH.reshape(b, kh, n // kh, t, h).transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)


def fused_linear(d_in: int, widths: tuple[int, ...], *, use_bias: bool, rngs: nnx.Rngs,
                 kernel_init, param_dtype, dtype) -> nnx.Linear:
  """One `nnx.Linear` whose kernel (and zero bias) are the column blocks of `len(widths)`
  projections, each initialised as its own `nnx.Linear` would be: the same keys drawn from
  `rngs` in the same order, so that a seed gives the same model whether its projections are
  fused or not."""
  kernels, biases = [], []
  for width in widths:
    kernels.append(kernel_init(rngs.params(), (d_in, width), param_dtype))
    if use_bias:
      biases.append(nnx.initializers.zeros_init()(rngs.params(), (width,), param_dtype))
  return nnx.Linear(d_in, sum(widths), use_bias=use_bias, param_dtype=param_dtype, dtype=dtype,
                    rngs=nnx.Rngs(0),  # unused: both initialisers return the blocks drawn above
                    kernel_init=lambda *_: jnp.concatenate(kernels, axis=1),
                    bias_init=lambda *_: jnp.concatenate(biases))


class Attention(nnx.Module):
  """Multi-head attention with grouped kv heads, RoPE, and the family's optional q/k/v bias
  (Qwen2) and per-head q/k RMSNorm before RoPE (Qwen3).

  q, k and v come from one `[D, (N + 2K) H]` kernel (`qkv_proj`, columns in that order): a decode
  step then makes one matrix-vector product where it made three. XLA:CPU runs a product of this
  size on one core whatever the thread count, at a bandwidth that grows with the matrix, so fewer,
  larger products bring a batch-1 step nearer the weight-read floor (docs/BENCHMARKS.md). The
  loaders and the exporter map Hugging Face's separate q/k/v tensors to and from its columns.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    d, h = cfg.d_model, cfg.hd
    kw = dict(param_dtype=jnp.dtype(cfg.param_dtype), dtype=jnp.dtype(cfg.dtype), rngs=rngs,
              kernel_init=nnx.initializers.normal(0.02))
    self.qkv_proj = fused_linear(d, (cfg.n_heads * h, cfg.n_kv_heads * h, cfg.n_kv_heads * h),
                                 use_bias=cfg.qkv_bias, **kw)
    self.o_proj = nnx.Linear(cfg.n_heads * h, d, use_bias=False, **kw)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(h, cfg.norm_eps, param_dtype=jnp.dtype(cfg.param_dtype))
      self.k_norm = RMSNorm(h, cfg.norm_eps, param_dtype=jnp.dtype(cfg.param_dtype))

  def qkv(self, x_BxTxD, positions_BxT):
    cfg = self.cfg
    b, t, _ = x_BxTxD.shape
    nq, nk = cfg.n_heads * cfg.hd, cfg.n_kv_heads * cfg.hd
    qkv = self.qkv_proj(x_BxTxD)
    q = qkv[..., :nq].reshape(b, t, cfg.n_heads, cfg.hd)
    k = qkv[..., nq:nq + nk].reshape(b, t, cfg.n_kv_heads, cfg.hd)
    v = qkv[..., nq + nk:].reshape(b, t, cfg.n_kv_heads, cfg.hd)
    if cfg.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    q = apply_rope(q, positions_BxT, cfg.rope_theta, cfg.rope_layout)
    k = apply_rope(k, positions_BxT, cfg.rope_theta, cfg.rope_layout)
    return q, k, v

  def out(self, attn_BxTxNxH):
    b, t = attn_BxTxNxH.shape[:2]
    return self.o_proj(attn_BxTxNxH.reshape(b, t, -1))


class MLP(nnx.Module):
  """SwiGLU feed-forward: down(silu(gate(x)) * up(x)), gate and up as one `[D, 2F]` kernel
  (`gate_up_proj`, gate's columns first) for the reason given in `Attention`."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    kw = dict(use_bias=False, param_dtype=jnp.dtype(cfg.param_dtype), dtype=jnp.dtype(cfg.dtype),
              rngs=rngs, kernel_init=nnx.initializers.normal(0.02))
    self.gate_up_proj = fused_linear(cfg.d_model, (cfg.d_ff, cfg.d_ff), **kw)
    self.down_proj = nnx.Linear(cfg.d_ff, cfg.d_model, **kw)

  def __call__(self, x):
    gate, up = jnp.split(self.gate_up_proj(x), 2, axis=-1)
    return self.down_proj(jax.nn.silu(gate) * up)
