"""On a GPU: the Pallas kernel executed through Triton (not interpreted, not only lowered) equals
the XLA path, and speculative decoding and replay through it are lossless there. Marked `gpu`:
`make test` deselects them, `make test-gpu` runs them (`JAX_PLATFORMS=cuda`), and where jax sees
no GPU they skip with the reason, so selecting them on CPU passes."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.drafter.test_drafter import STOPS, _trained_drafter
from tests.kernels.test_attention import _case, _generate
from tests.spec.test_spec_engine import _prompts, peaked_model
from tlt_jax.kernels.attention import Prefix, attention, to_cache_layout
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.rollout.history import HistoryConfig, ReplayConfig
from tlt_jax.rollout.noise import PromptNoise

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(jax.devices()[0].platform != "gpu",
                                 reason=f"needs a GPU; jax sees {jax.devices()[0].platform}")]

# Triton's float32 dots take TF32 inputs (10-bit mantissa) and XLA's may too, so the two paths
# agree to ~1e-3 on these O(1) values; bf16 inputs to ~1e-2. A wrong mask, tile or merge moves
# outputs by O(0.1-1).
ATOL = {jnp.float32: 5e-3, jnp.bfloat16: 6e-2}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("g", [1, 3, 8])
@pytest.mark.parametrize("t,tree", [(1, False), (4, False), (8, False), (8, True)])
def test_the_triton_kernel_equals_the_xla_path(dtype, g, t, tree):
  q, k_new, v_new, k_cache, v_cache, lengths, mask = (
      x.astype(dtype) if x.dtype == jnp.float32 else x
      for x in _case(4, t, 2, g, 64, 512, tree, seed=g + t))
  with jax.default_matmul_precision("highest"):
    ref = attention(q, k_new, v_new, mask,
                    Prefix(*to_cache_layout(k_cache, v_cache, "xla"), lengths, "xla"))
  out = attention(q, k_new, v_new, mask,
                  Prefix(*to_cache_layout(k_cache, v_cache, "pallas"), lengths, "pallas"))
  err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32))))
  print(f"[gpu] {jnp.dtype(dtype).name} g={g} t={t} tree={tree}: max |pallas - xla| {err:.2e}")
  assert err < ATOL[dtype]
  # The slots past a row's length are never read: changing them changes nothing, bit for bit.
  garbage = jnp.where(jnp.arange(512)[None, :, None, None] >= lengths[:, None, None, None],
                      jnp.asarray(1e3, dtype), k_cache)
  again = attention(q, k_new, v_new, mask,
                    Prefix(*to_cache_layout(garbage, v_cache, "pallas"), lengths, "pallas"))
  np.testing.assert_array_equal(np.asarray(again, np.float32), np.asarray(out, np.float32))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_speculative_decoding_through_the_triton_kernel_is_lossless(temperature):
  """SD through the kernel equals plain decoding through the kernel (greedy, and `coupled` at
  T = 1), and the XLA path's tokens: the peaked model's margins are far above TF32's noise."""
  target = peaked_model(scale=8.0)
  drafter = _trained_drafter(target)[0]
  params = SamplingParams(temperature=temperature, max_new_tokens=16, stop_tokens=STOPS)
  out, eng = _generate(target, drafter, params, "pallas", key=3)
  plain, _ = _generate(target, drafter, params, "pallas", key=3, spec=False)
  ref, _ = _generate(target, drafter, params, "xla", key=3)
  assert eng.attention == "pallas"
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-3)
  assert eng.spec.accept_len() > 1.1  # drafts were verified through the kernel


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_replay_through_the_triton_kernel_gives_the_tokens_of_decoding_afresh(temperature):
  """Prompt-addressed noise: the first halves of earlier responses, replayed 8 tokens per verify
  through the kernel, give the tokens of decoding afresh through the kernel and the XLA path."""
  target = peaked_model(scale=8.0)
  params = SamplingParams(temperature=temperature, max_new_tokens=24, stop_tokens=STOPS)
  prompts = _prompts(4, seed=5)
  addresses = PromptNoise().addresses(prompts, 2)

  def generate(impl, chunk, replay=None):
    eng = RolloutEngine(target, EngineConfig(batch_buckets=(4, 8), max_batch=8,
                                             steps_per_dispatch=3, precompile=False,
                                             attention=impl),
                        replay=ReplayConfig("prompt", history=HistoryConfig(
                            max_tokens=10_000 if chunk else 0, chunk=chunk)))
    return eng.generate(prompts, 2, params, jax.random.key(3), addresses=addresses,
                        replay=replay)

  fresh = generate("pallas", 0)
  stored = [fresh.response(i)[: fresh.lengths[i] // 2] for i in range(len(fresh.lengths))]
  replayed = generate("pallas", 8, stored)
  np.testing.assert_array_equal(replayed.tokens, fresh.tokens)
  np.testing.assert_array_equal(replayed.tokens, generate("xla", 0).tokens)
  assert replayed.timeline.summary()["replay_fraction"] > 0.2


def test_invariant_numerics_through_the_kernel_compute_a_position_alike_in_every_call():
  """On the GPU a model in invariant numerics attends through the invariant kernel (not the
  `jnp` path, whose batched products cuBLAS runs by the batch's shape): every call of
  tests/models/test_invariant.py gives the full forward's logits and hidden states bit for bit,
  bf16, and so does the kernel alone."""
  from tests.kernels import test_invariant_pallas
  from tests.models import test_invariant
  from tlt_jax.models import invariant

  assert invariant.KERNEL is None  # by backend: the kernel, compiled by Triton
  with pytest.MonkeyPatch.context() as mp:
    test_invariant.test_a_position_is_computed_alike_by_every_call("bfloat16", None, mp)
    mp.setattr(test_invariant_pallas.invariant_pallas, "call_kernel",
               functools.partial(_compiled, test_invariant_pallas.invariant_pallas.call_kernel))
    test_invariant_pallas.test_a_query_row_s_output_is_the_same_in_every_call()


def _compiled(call, *args, interpret):
  del interpret
  return call(*args, interpret=False)


@pytest.mark.parametrize("temperature,arms", [(0.0, "chain"), (1.0, "chain"), (1.0, "tree")])
def test_bf16_speculative_decoding_in_invariant_numerics_equals_plain_decoding(temperature,
                                                                               arms):
  """tests/drafter/test_drafter.py's equality, every row and every log-prob, on the GPU."""
  from tests.drafter import test_drafter

  test_drafter.test_bf16_speculative_decoding_in_invariant_numerics_equals_plain_decoding(
      temperature, test_drafter.EAGLE[:1] if arms == "chain" else test_drafter.TREE[:1])
