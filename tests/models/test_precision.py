"""The precision policy: float32 changes nothing; bf16 compute keeps float32 master weights and
float32 logits; the rollout's copy cast once per sync computes what the update's per-forward
casts compute, bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.conftest import small_config
from tlt_jax.drafter.buffer import BufferConfig, DataBuffer
from tlt_jax.models import init_model
from tlt_jax.models.precision import Precision, compute_copy
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.rollout.programs import Layout

TOKENS = jnp.array([[3, 9, 14, 2, 40, 7, 11, 5]], jnp.int32)


def dtypes(tree) -> set[str]:
  return {str(x.dtype) for x in jax.tree.leaves(tree)}


def test_float32_is_the_same_model_and_the_same_weights():
  m = init_model(small_config(), seed=0)
  assert Precision().apply(m) is m
  state = nnx.state(m)
  assert all(a is b for a, b in zip(jax.tree.leaves(state),
                                    jax.tree.leaves(compute_copy(state, "float32"))))


def test_bf16_compute_keeps_float32_master_weights_and_float32_logits():
  m = init_model(small_config(tie_embeddings=False), seed=0)
  b = Precision(compute_dtype="bfloat16").apply(m)
  assert (b.cfg.dtype, b.cfg.param_dtype) == ("bfloat16", "float32")
  assert dtypes(nnx.state(b, nnx.Param)) == {"float32"}
  for x, y in zip(jax.tree.leaves(nnx.state(m)), jax.tree.leaves(nnx.state(b))):
    np.testing.assert_array_equal(x, y)
  ref, out = m(TOKENS), b(TOKENS)
  assert out.logits_BxTxV.dtype == jnp.float32 and out.hidden_BxTxD.dtype == jnp.bfloat16
  gap = float(jnp.abs(out.logits_BxTxV - ref.logits_BxTxV).max())
  assert 0 < gap < 0.05  # bf16 matmuls really ran, and stay close to float32


def test_the_rollout_copy_computes_what_the_update_computes():
  """Matrices cast once (the rollout's weights) give exactly the logits of float32 masters cast
  in every forward (the update's), with norm scales and biases kept float32."""
  b = Precision(compute_dtype="bfloat16").apply(
      init_model(small_config(tie_embeddings=False, family="qwen2"), seed=1))
  graphdef, state = nnx.split(b)
  copy = compute_copy(state, "bfloat16")
  for path, x in nnx.to_flat_state(copy):
    assert str(x.dtype) == ("bfloat16" if x.ndim >= 2 else "float32"), path
  np.testing.assert_array_equal(nnx.merge(graphdef, copy)(TOKENS).logits_BxTxV,
                                b(TOKENS).logits_BxTxV)


def test_the_engine_holds_compute_dtype_weights_and_its_cache_dtype():
  b = Precision(compute_dtype="bfloat16").apply(init_model(small_config(), seed=0))
  cfg = EngineConfig(batch_buckets=(2,), max_batch=2, prefill_buckets=(16,), precompile=False)
  engine = RolloutEngine(b, cfg)
  assert dtypes(engine.weights.shard(0)[0]) == {"bfloat16", "float32"}  # matrices, vectors
  layout = Layout(cache_len=32, n=8, capture=False, ctx_len=0)
  cache = lambda e: e.programs.state_shape(2, layout).cache  # what every program carries
  assert {x.dtype for x in cache(engine).k + cache(engine).v} == {jnp.dtype("bfloat16")}
  wide = RolloutEngine(b, EngineConfig(**{**cfg.__dict__, "cache_dtype": "float32"}))
  assert {x.dtype for x in cache(wide).k + cache(wide).v} == {jnp.dtype("float32")}


@pytest.mark.parametrize("kw, message", [
    (dict(compute_dtype="bf16"), "compute_dtype='bf16' is not one of float32, bfloat16"),
    (dict(param_dtype="bfloat16"), "param_dtype=bfloat16 is narrower than compute_dtype=float32"),
])
def test_a_bad_policy_is_a_clear_error(kw, message):
  with pytest.raises(ValueError, match=message):
    Precision(**kw)


def test_captured_hidden_states_keep_the_compute_dtype():
  """A bf16 rollout's captured hidden states reach the drafter's buffer and its batches in bf16
  (half the transfer and memory of float32), equal to what the device held."""
  b = Precision(compute_dtype="bfloat16").apply(init_model(small_config(), seed=0))
  engine = RolloutEngine(b, EngineConfig(batch_buckets=(4,), max_batch=4, prefill_buckets=(16,),
                                         precompile=False))
  params = SamplingParams(temperature=1.0, max_new_tokens=6)
  res = engine.generate([[3, 4, 5], [6, 7]], 2, params, jax.random.key(0), capture_hidden=True)
  hidden, prompt_hidden = res.hidden.to_host()
  assert all(p.hidden_BxNxD.dtype == p.prompt_hidden_BxD.dtype == jnp.bfloat16
             for p in res.hidden.pieces)
  buf = DataBuffer(BufferConfig(min_length=1), b.cfg.d_model, b.cfg.dtype)
  buf.add_rollout([[3, 4, 5], [6, 7]], 2, res, version=0, step=0)
  seg = buf.segments()[0]
  assert buf.ring_CxD.nbytes == buf.cfg.max_tokens * b.cfg.d_model * 2  # bf16 values, as bits
  assert buf.hidden(seg).dtype == jnp.bfloat16
  np.testing.assert_array_equal(buf.hidden(seg)[0], prompt_hidden[0])
  np.testing.assert_array_equal(buf.hidden(seg)[1:], hidden[0, :res.lengths[0]])
  assert buf.pack(buf.segments(), 8, 0)[1].dtype == jnp.bfloat16
