"""Half-precision buffers written as their bits: the same values, in place."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tlt_jax.drafter import buffer
from tlt_jax.models.bits import update_as_bits
from tlt_jax.rollout import programs, state
from tests.conftest import small_config


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_an_update_of_the_bits_writes_the_values_of_the_update(dtype):
  x = jax.random.normal(jax.random.key(0), (5, 7), jnp.float32).astype(dtype)
  new = jax.random.normal(jax.random.key(1), (3, 7), jnp.float32)  # cast to x's dtype
  rows = jnp.array([4, 0, 9])  # 9: past the end, dropped
  scatter = lambda a, v: a.at[rows].set(v, mode="drop")
  dus = lambda a, v: jax.lax.dynamic_update_slice(a, v[:2], (1, 0))
  for update in (scatter, dus):
    got = update_as_bits(update, x, new)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)),
                                  np.asarray(update(x, new.astype(dtype)).astype(jnp.float32)))


def _holds_a_copy(compiled, buffer) -> bool:
  """Whether `compiled`'s temporaries could hold a copy of `buffer` (written in place, they hold
  only the new rows)."""
  return compiled.memory_analysis().temp_size_in_bytes >= buffer.nbytes


def test_the_drafter_s_bf16_ring_is_written_in_place():
  """The ring holds up to 200,000 hidden states (230 MB of bf16 at SmolLM2's width): a write of a
  rollout's rows copies none of it (jax 0.10's XLA:CPU wrote a bf16 ring through a float32 copy,
  and a bitcast of a bf16 ring to its bits outside the write's fusion through a uint16 one)."""
  buf = buffer.DataBuffer(buffer.BufferConfig(max_tokens=4096), d_model=64, dtype="bfloat16")
  hidden, prompt = jnp.zeros((2, 16, 64), jnp.bfloat16), jnp.zeros((2, 64), jnp.bfloat16)
  k = jnp.zeros((8,), jnp.int32)
  compiled = buffer.write_rows.lower(buf.ring_CxD, hidden, prompt, k, k, k, buf.dtype).compile()
  assert not _holds_a_copy(compiled, buf.ring_CxD)


def test_a_step_captures_bf16_hidden_states_in_place():
  """`emit` writes each step's hidden states into the rows' bf16 `[B, N, D]` capture buffer with
  no copy of it."""
  b, n, m = 3, 256, 4
  cfg = dataclasses.replace(small_config(), dtype="bfloat16")
  layout = programs.Layout(cache_len=8, n=n, capture=True, ctx_len=8)
  st = state.empty_state(cfg, b, layout, pad_id=0)

  def emit(st, toks, hidden):
    return state.emit(st, toks, jnp.zeros(toks.shape), hidden, jnp.full((b,), m), jnp.array([1]),
                      n, 0)[0]

  compiled = jax.jit(emit, donate_argnums=0).lower(
      st, jnp.zeros((b, m), jnp.int32), jnp.zeros((b, m, cfg.d_model), jnp.bfloat16)).compile()
  assert not _holds_a_copy(compiled, st.captured.hidden_BxNxD)
