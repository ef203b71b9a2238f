"""The invariant attention's Pallas kernel (interpreted on CPU): it computes the `jnp` path's
function, a query row's output is bitwise the same in every call, whole models through it are
invariant, both paths are differentiated alike, and it lowers for the GPU's Triton backend."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import lower_for_gpu
from tests.models import test_invariant
from tlt_jax.kernels import invariant_pallas
from tlt_jax.models import invariant


def _case(dtype, b=2, kh=2, m=12, s=192, h=64, seed=0):
  """Query rows, keys `[B, K, H, S]` and values `[B, K, S, H]`, and a causal-like visibility:
  query row i sees slots up to i + 100 (its kv head's rows are G heads x T tokens: any pattern
  holds)."""
  rng = np.random.default_rng(seed)
  x = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)
  visible = jnp.asarray(np.tril(np.ones((m, s), bool), k=100)[None].repeat(b, 0))
  return x(b, kh, m, h), x(b, kh, h, s), x(b, kh, s, h), visible


@pytest.mark.parametrize("dtype,atol", [(jnp.float32, 2e-6), (jnp.bfloat16, 2e-6)])
def test_the_kernel_computes_the_jnp_path_s_function(dtype, atol):
  """The same attention up to float32 rounding (the two sum in other orders); a wrong mask,
  block or softmax would move outputs by O(0.1)."""
  q, k, v, visible = _case(dtype)
  got = invariant_pallas.call_kernel(q, k, v, visible, interpret=True)
  want = jax.jit(invariant.jnp_attention)(q, k, v, visible)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=atol, rtol=0)
  # A row that sees nothing (padding) comes out zero.
  blind = invariant_pallas.call_kernel(q, k, v, jnp.zeros_like(visible), interpret=True)
  np.testing.assert_array_equal(np.asarray(blind), 0.0)


def test_a_query_row_s_output_is_the_same_in_every_call():
  """Bitwise: a row alone or beside another, 1 or 4 of its query rows (a decode step, a verify),
  over a longer cache whose extra slots it does not see, and whatever the slots past what it
  sees hold."""
  q, k, v, visible = _case(jnp.float32, s=256)
  call = lambda q, k, v, vis: np.asarray(invariant_pallas.call_kernel(q, k, v, vis, interpret=True))
  full = call(q, k[..., :192], v[:, :, :192], visible[..., :192])
  for rows, start, n, slots in [((0, 1), 3, 1, 192), ((1,), 7, 1, 192), ((0, 1), 4, 4, 192),
                                ((0,), 8, 4, 256)]:
    r = np.asarray(rows)
    got = call(q[r, :, start:start + n], k[r, ..., :slots], v[r, :, :slots],
               visible[r, start:start + n, :slots])
    np.testing.assert_array_equal(got, full[r, :, start:start + n],
                                  err_msg=f"{rows} {start} {n} {slots}")
  garbage = k.at[..., 120:].set(1e3)  # rows 0-11 see slots up to 111 at most
  np.testing.assert_array_equal(call(q, garbage[..., :192], v[:, :, :192],
                                     visible[..., :192]), full)


@pytest.fixture
def through_the_kernel(monkeypatch):
  """Models attend through the interpreted kernel; traces made under the `jnp` path before, or
  under the kernel here, are dropped (a trace reads `invariant.KERNEL` once)."""
  jax.clear_caches()
  monkeypatch.setattr(invariant, "KERNEL", "interpret")
  yield
  monkeypatch.undo()
  jax.clear_caches()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_model_through_the_kernel_computes_a_position_alike_in_every_call(
    dtype, through_the_kernel, monkeypatch):
  test_invariant.test_a_position_is_computed_alike_by_every_call(dtype, None, monkeypatch)


def test_both_paths_are_differentiated_as_plain_attention(monkeypatch):
  """A pallas call has no derivative: `invariant.attention` differentiates the kernel and the
  `jnp` path alike, as `plain_attention` (bitwise the same gradients), whose function they
  compute (a plain softmax attention in another order: the same values to float32 rounding)."""
  q, k, v, visible = _case(jnp.float32)
  b, kh, m, h = q.shape
  q_BxTxNxH = q.reshape(b, kh, 3, m // 3, h).transpose(0, 3, 1, 2, 4).reshape(b, m // 3, -1, h)
  vis_BxTxS = visible[:, :m // 3]  # each token's rows see what its first head's row sees
  w = jnp.asarray(np.random.default_rng(1).standard_normal(q_BxTxNxH.shape), jnp.float32)
  grads = {}
  for kernel in ("interpret", "jnp"):
    monkeypatch.setattr(invariant, "KERNEL", kernel)
    grads[kernel] = jax.grad(lambda *x: jnp.sum(w * invariant.attention(*x, vis_BxTxS)),
                             argnums=(0, 1, 2))(q_BxTxNxH, k, v)
  for got, want in zip(grads["interpret"], grads["jnp"]):
    assert np.abs(np.asarray(want)).max() > 0
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  vis_BxMxS = jnp.broadcast_to(vis_BxTxS[:, None], (b, 3, m // 3, vis_BxTxS.shape[-1])).reshape(
      b, m, -1)
  np.testing.assert_allclose(np.asarray(invariant.plain_attention(q, k, v, vis_BxMxS)),
                             np.asarray(invariant.jnp_attention(q, k, v, vis_BxMxS)), atol=2e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_kernel_lowers_for_the_gpu_triton_backend(dtype):
  args = _case(dtype, s=192)  # 3 blocks: not a power of two
  text = lower_for_gpu(jax.jit(lambda *a: invariant_pallas.call_kernel(*a, interpret=False)),
                       *args)
  assert "xla.gpu.triton" in text and "mosaic" not in text
