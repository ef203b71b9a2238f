"""Transformer building blocks: RMSNorm, rotary embeddings, the attention projections, SwiGLU
(attention itself is `kernels.attention`)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from tlt_jax.models.config import ModelConfig


class RMSNorm(nnx.Module):
  """Root-mean-square norm with a learned scale, computed in float32. `axis` is the logical axis
  of the normalised dimension (the model width's scale stays whole on every device)."""

  def __init__(self, dim: int, eps: float, *, param_dtype=jnp.float32, axis: str = "norm"):
    self.scale = param(jnp.ones((dim,), param_dtype), (axis,))
    self.eps = eps

  def __call__(self, x, in_order: bool = False):
    """`x` normalised; `in_order` (invariant numerics): the mean of squares as a product with two
    columns of ones, which XLA:CPU computes alike for any number of rows from two, where it
    vectorises a reduction by the rows it holds."""
    x32 = x.astype(jnp.float32)
    if in_order:
      squares = (x32 * x32) @ jnp.ones((x.shape[-1], 2), jnp.float32)
      mean = squares[..., :1] / x.shape[-1]
    else:
      mean = jnp.mean(x32 * x32, axis=-1, keepdims=True)
    y = x32 * jax.lax.rsqrt(mean + self.eps)
    return (y * self.scale[...].astype(jnp.float32)).astype(x.dtype)


def rope_inv_freq(h: int, theta: float, llama3=None) -> jax.Array:
  """RoPE's `[H / 2]` inverse frequencies; with `llama3` = (factor, low_freq_factor,
  high_freq_factor, original context) Llama 3.1's scaling: long wavelengths divided by the
  factor, short ones kept, those between interpolated."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, h, 2, dtype=jnp.float32) / h))
  if llama3 is None:
    return inv_freq
  factor, low, high, context = llama3
  wavelen = 2 * math.pi / inv_freq
  scaled = jnp.where(wavelen > context / low, inv_freq / factor, inv_freq)
  smooth = (context / wavelen - low) / (high - low)
  medium = (wavelen >= context / high) & (wavelen <= context / low)
  return jnp.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def apply_rope(x_BxTxNxH: jax.Array, positions_BxT: jax.Array, theta: float, layout: str,
               llama3=None) -> jax.Array:
  """Rotary position embedding in the HF rotate-half or the GGUF interleaved-pair layout (with
  Llama 3.1's frequency scaling when `llama3` gives its parameters)."""
  h = x_BxTxNxH.shape[-1]
  inv_freq = rope_inv_freq(h, theta, llama3)
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


def param(value: jax.Array, axes: tuple[str | None, ...]) -> nnx.Param:
  """A parameter that declares the logical axis of each of its dimensions (`sharding.py` maps
  them onto mesh axes; None: never split)."""
  if len(axes) != value.ndim:
    raise ValueError(f"{len(axes)} logical axes {axes} for a parameter of shape {value.shape}.")
  return nnx.Param(value, axes=tuple(axes))


def draw_kernels(rngs: nnx.Rngs, d_in: int, widths: tuple[int, ...], use_bias: bool, param_dtype
                 ) -> list[tuple[jax.Array, jax.Array | None]]:
  """(kernel `[d_in, width]`, zero bias or None) of `len(widths)` projections, drawn from `rngs`
  in the order separate `nnx.Linear` layers would draw them (a key for the kernel, then one for
  the bias), so that a seed gives the same model whatever the layout the kernels are stored in."""
  init = nnx.initializers.normal(0.02)
  out = []
  for width in widths:
    kernel = init(rngs.params(), (d_in, width), param_dtype)
    bias = (nnx.initializers.zeros_init()(rngs.params(), (width,), param_dtype)
            if use_bias else None)
    out.append((kernel, bias))
  return out


class Dense(nnx.Module):
  """`x @ kernel (+ bias)`, contracting x's last axis with the kernel's first: the kernel is
  `[D_in, *out]` (a projection whose output keeps a structure, e.g. `[K, G + 2, H]`), the bias
  `[*out]`. Both declare logical axes."""

  def __init__(self, kernel: jax.Array, axes: tuple[str | None, ...],
               bias: jax.Array | None = None, *, dtype):
    self.kernel = param(kernel, axes)
    self.bias = param(bias, axes[1:]) if bias is not None else None
    self.dtype = dtype

  def __call__(self, x):
    y = jnp.tensordot(x.astype(self.dtype), self.kernel[...].astype(self.dtype), axes=1)
    return y if self.bias is None else y + self.bias[...].astype(self.dtype)


def dense(rngs: nnx.Rngs, d_in: int, d_out: int, axes: tuple[str | None, str | None], cfg
          ) -> Dense:
  """A `[d_in, d_out]` projection without bias, initialised as `nnx.Linear` would be."""
  ((kernel, _),) = draw_kernels(rngs, d_in, (d_out,), False, jnp.dtype(cfg.param_dtype))
  return Dense(kernel, axes, dtype=jnp.dtype(cfg.dtype))


class Attention(nnx.Module):
  """Multi-head attention with grouped kv heads, RoPE, and the family's optional q/k/v bias
  (Qwen2) and per-head q/k RMSNorm before RoPE (Qwen3).

  q, k and v come from one kernel `[D, K, G + 2, H]` (`qkv_proj`): for each kv head, its G query
  heads, then its key, then its value. A decode step then makes one matrix-vector product where
  it made three (XLA:CPU runs a product of this size on one core whatever the thread count, at a
  bandwidth that grows with the matrix, so fewer, larger products bring a batch-1 step nearer the
  weight-read floor: docs/BENCHMARKS.md), and splitting the kv-head axis over `tp` gives each
  device whole heads with their queries. The loaders and the exporter map Hugging Face's
  separate q/k/v tensors to and from it (`weights.py`).
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, in_features: int | None = None):
    self.cfg = cfg
    d, h, kh = cfg.d_model, cfg.hd, cfg.n_kv_heads
    g = cfg.n_heads // kh
    pd = jnp.dtype(cfg.param_dtype)
    # `in_features`: the width q, k and v are projected from, when not D (an EAGLE-3 midlayer's 2D)
    (q, qb), (k, kb), (v, vb) = draw_kernels(rngs, in_features or d,
                                             (cfg.n_heads * h, kh * h, kh * h),
                                             cfg.qkv_bias, pd)
    head_major = lambda x_xW, n: x_xW.reshape(*x_xW.shape[:-1], kh, n, h)
    kernel = jnp.concatenate([head_major(q, g), head_major(k, 1), head_major(v, 1)], axis=-2)
    bias = (jnp.concatenate([head_major(qb, g), head_major(kb, 1), head_major(vb, 1)], axis=-2)
            if cfg.qkv_bias else None)
    self.qkv_proj = Dense(kernel, ("embed", "kv_heads", None, "head_dim"), bias,
                          dtype=jnp.dtype(cfg.dtype))
    self.o_proj = dense(rngs, cfg.n_heads * h, d, ("heads", "embed"), cfg)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(h, cfg.norm_eps, param_dtype=pd, axis="head_dim")
      self.k_norm = RMSNorm(h, cfg.norm_eps, param_dtype=pd, axis="head_dim")

  def qkv(self, x_BxTxD, positions_BxT):
    """Queries, keys and values `[B, T, heads, H]` of `x_BxTxD` at `positions_BxT`, rotated and
    normalised as the family asks."""
    cfg = self.cfg
    b, t, _ = x_BxTxD.shape
    g = cfg.n_heads // cfg.n_kv_heads
    qkv_BxTxKxG2xH = self.qkv_proj(x_BxTxD)
    q = qkv_BxTxKxG2xH[..., :g, :].reshape(b, t, cfg.n_heads, cfg.hd)  # head n = kv head n // G
    k = qkv_BxTxKxG2xH[..., g, :]
    v = qkv_BxTxKxG2xH[..., g + 1, :]
    if cfg.qk_norm:
      in_order = cfg.numerics == "invariant"
      q, k = self.q_norm(q, in_order), self.k_norm(k, in_order)
    q = apply_rope(q, positions_BxT, cfg.rope_theta, cfg.rope_layout, cfg.llama3_rope)
    k = apply_rope(k, positions_BxT, cfg.rope_theta, cfg.rope_layout, cfg.llama3_rope)
    return q, k, v

  def out(self, attn_BxTxNxH):
    """The output projection of the attended values."""
    b, t = attn_BxTxNxH.shape[:2]
    return self.o_proj(attn_BxTxNxH.reshape(b, t, -1))


class MLP(nnx.Module):
  """SwiGLU feed-forward: down(silu(gate(x)) * up(x)), gate and up as one `[D, 2, F]` kernel
  (`gate_up_proj`) for the reason given in `Attention`; splitting F over `tp` gives each device
  its gate and up columns together."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    (gate, _), (up, _) = draw_kernels(rngs, cfg.d_model, (cfg.d_ff, cfg.d_ff), False,
                                      jnp.dtype(cfg.param_dtype))
    self.gate_up_proj = Dense(jnp.stack([gate, up], axis=1), ("embed", None, "mlp"),
                              dtype=jnp.dtype(cfg.dtype))
    self.down_proj = dense(rngs, cfg.d_ff, cfg.d_model, ("mlp", "embed"), cfg)

  def __call__(self, x):
    gate_up_BxTx2xF = self.gate_up_proj(x)
    return self.down_proj(jax.nn.silu(gate_up_BxTx2xF[..., 0, :]) * gate_up_BxTx2xF[..., 1, :])
