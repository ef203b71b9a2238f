"""The precision policy: the dtype the weights are kept in (`param_dtype`: the update's master copy,
and so its gradients and optimizer state) and the dtype matmuls and activations run in
(`compute_dtype`). A run sets them in `config.model`; the KV cache's dtype is the rollout
engine's `cache_dtype` (empty: the compute dtype).

Whatever the policy, norms, RoPE, attention's softmax statistics, logits, sampling and recorded
log-probs are float32 (`layers.py`, `kernels/attention.py`, `Transformer.head`). float32
throughout is the default (on CPU bf16 matmuls are slower than f32); bf16 compute and cache over
float32 parameters is the accelerator setting. The rollout runs on a copy of the weights cast to
the compute dtype once per weight sync (`compute_copy`), the values every forward pass of the
update casts them to.

`numerics` is how the reductions run: "fast" lets XLA order each by the call's shapes;
"invariant" fixes every order, so that a position's numbers are the same in a decode step, a
chain verify, a prefill and the update's full forward (`invariant.py`; docs/SPECULATION.md).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from tlt_jax.models.config import NUMERICS
from tlt_jax.models.transformer import Transformer, abstract_model

DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class Precision:
  """A run's precision policy (`config.model.param_dtype`, `config.model.compute_dtype`)."""

  param_dtype: str = "float32"    # the master weights, their gradients and optimizer state
  compute_dtype: str = "float32"  # matmuls and activations (float32 | bfloat16 | float16)
  numerics: str = "fast"          # fast | invariant: each position's numbers the same in any call

  def __post_init__(self):
    for name in ("param_dtype", "compute_dtype"):
      if getattr(self, name) not in DTYPES:
        raise ValueError(f"{name}={getattr(self, name)!r} is not one of {', '.join(DTYPES)}.")
    if self.numerics not in NUMERICS:
      raise ValueError(f"numerics={self.numerics!r} is not one of {', '.join(NUMERICS)}.")
    if jnp.finfo(self.param_dtype).bits < jnp.finfo(self.compute_dtype).bits:
      raise ValueError(f"param_dtype={self.param_dtype} is narrower than compute_dtype="
                       f"{self.compute_dtype}: keep the master weights at least as wide.")

  def apply(self, model: Transformer) -> Transformer:
    """`model` under this policy: its config's `dtype` (compute), `param_dtype` and `numerics`
    set, its weights cast to the parameter dtype. The same object when nothing changes."""
    cfg = model.cfg.replace(dtype=self.compute_dtype, param_dtype=self.param_dtype,
                            numerics=self.numerics)
    if cfg == model.cfg:
      return model
    out = abstract_model(cfg)
    param = jnp.dtype(self.param_dtype)
    nnx.update(out, jax.tree.map(
        lambda x: x.astype(param) if jnp.issubdtype(x.dtype, jnp.floating) else x,
        nnx.state(model)))
    return out


def compute_copy(state, dtype):
  """The weights a forward pass in `dtype` reads: matrices (kernels, embedding tables) cast to
  `dtype`, vectors (norm scales, biases) and integers kept; `state` itself when nothing changes
  (float32 compute). Cast once per weight sync, this spares the rollout a cast per step and half
  of each step's weight reads."""
  dtype = jnp.dtype(dtype)
  cast = lambda x: (x.astype(dtype) if x.ndim >= 2 and jnp.issubdtype(x.dtype, jnp.floating)
                    and x.dtype != dtype else x)
  return jax.tree.map(cast, state)
