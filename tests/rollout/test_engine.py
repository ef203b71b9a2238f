"""RolloutEngine: exactness against plain decoding, layout invariance, log-probs, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.experimental.compilation_cache import compilation_cache

from tests.conftest import jit_forward, run_on_fake_devices, small_config
from tests.statistics import chi_square_pvalue
from tlt_jax.models import init_model
from tlt_jax.models.sampling import SamplingParams, processed_logprobs
from tlt_jax.rollout import compiles
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.rollout.pool import ExecutablePool
from tlt_jax.rollout.plain import generate_plain

STOPS = (7, 9, 11)


def _prompts(n=5, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(3, 53, size=int(rng.integers(2, 14))).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def model():
  return init_model(small_config(), seed=0)


def _engine(model, **kw):
  base = dict(batch_buckets=(4, 8, 16), max_batch=16, steps_per_dispatch=4,
              precompile=False)
  base.update(kw)
  return RolloutEngine(model, EngineConfig(**base))


# Near-ties: both paths compute float32 logits with the same ops; a token could only differ where
# the top two logits are within rounding (~1e-6) of each other. With these random weights the
# margins are far larger, so the tests demand exact equality and would report such a case.
@pytest.mark.parametrize("buckets,k", [((1, 2, 4, 8, 16), 1), ((16,), 4), ((2, 8, 16), 3),
                                       ((1, 3, 5, 16), 8)])
def test_greedy_equals_plain_full_batch_decode(model, buckets, k):
  prompts, g = _prompts(), 2
  params = SamplingParams(temperature=0.0, max_new_tokens=24, stop_tokens=STOPS)
  res = _engine(model, batch_buckets=buckets, steps_per_dispatch=k).generate(
      prompts, g, params, jax.random.key(0))
  ref = generate_plain(model, [p for p in prompts for _ in range(g)], jax.random.key(0), params)
  np.testing.assert_array_equal(res.tokens, ref.tokens)
  np.testing.assert_array_equal(res.lengths, ref.lengths)
  assert len(set(res.lengths.tolist())) > 1  # rows really finish at different times
  assert res.stop_reasons == ["stop" if s else "length" for s in ref.stopped]


def test_the_samples_of_a_prompt_share_one_prefill(model):
  """G samples of a prompt are prefilled once (u = 2 rows for b = 8) and their cache rows copied:
  greedy output still equals the plain decode, and sampled output the unshared engine's."""
  prompts, g = _prompts(2, seed=3), 4
  greedy = SamplingParams(temperature=0.0, max_new_tokens=16, stop_tokens=STOPS)
  eng = _engine(model, batch_buckets=(2, 8), max_batch=8)  # the 2 distinct prompts: u = 2
  res = eng.generate(prompts, g, greedy, jax.random.key(0))
  ref = generate_plain(model, [p for p in prompts for _ in range(g)], jax.random.key(0), greedy)
  np.testing.assert_array_equal(res.tokens, ref.tokens)
  prefill_keys = [e.key for e in eng.pool.events if e.key[0] == "prefill"]
  assert [(k[2], k[3]) for k in prefill_keys] == [(8, 2)]  # (batch b, distinct prompts u)
  sampled = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=16, stop_tokens=STOPS)
  a = eng.generate(prompts, g, sampled, jax.random.key(5))
  b = _engine(model, batch_buckets=(8,), max_batch=8).generate(prompts, g, sampled,
                                                               jax.random.key(5))
  np.testing.assert_array_equal(a.tokens, b.tokens)


def test_sampled_outputs_identical_across_buckets_k_and_waves(model):
  prompts, g = _prompts(6, seed=1), 3
  params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=20, stop_tokens=STOPS)
  key = jax.random.key(42)
  runs = [_engine(model, **kw).generate(prompts, g, params, key) for kw in (
      dict(), dict(batch_buckets=(32,), max_batch=32, steps_per_dispatch=1),
      dict(batch_buckets=(1, 4, 8), max_batch=8, steps_per_dispatch=5))]  # 3 waves of 8 rows
  for r in runs[1:]:
    np.testing.assert_array_equal(r.tokens, runs[0].tokens)
    np.testing.assert_allclose(r.logprobs, runs[0].logprobs, atol=1e-5)
  assert len(set(runs[0].lengths.tolist())) > 1


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, max_new_tokens=16, stop_tokens=STOPS),
    SamplingParams(temperature=0.7, top_k=5, max_new_tokens=16, stop_tokens=STOPS),
    SamplingParams(temperature=1.0, top_p=0.8, max_new_tokens=16, stop_tokens=STOPS)])
def test_logprobs_and_hidden_states_equal_a_full_forward(model, params):
  prompts = _prompts(3, seed=2)
  eng = _engine(model)
  res = eng.generate(prompts, 2, params, jax.random.key(1), capture_hidden=True)
  # They stay on the devices that decoded them until asked for.
  assert res.hidden.pieces and all(
      isinstance(a, jax.Array) and a.devices() <= set(eng.devices)
      for p in res.hidden.pieces for a in (p.hidden_BxNxD, p.prompt_hidden_BxD))
  hidden, prompt_hidden = res.hidden.to_host()
  # One forward over the six sequences, right-padded (a causal model's positions before the
  # padding do not see it): one program, not one per sequence length.
  seqs = [prompts[i // 2] + res.response(i) for i in range(6)]
  batch = np.zeros((6, max(map(len, seqs))), np.int32)
  for i, seq in enumerate(seqs):
    batch[i, : len(seq)] = seq
  out = jit_forward(model, jnp.asarray(batch))
  logp_all = jax.jit(lambda x: processed_logprobs(x, params))(out.logits_BxTxV)
  for i in range(6):
    prompt, resp = prompts[i // 2], res.response(i)
    logp = np.asarray(logp_all[i, len(prompt) - 1: len(seqs[i]) - 1])
    want = np.take_along_axis(logp, np.asarray(resp)[:, None], axis=1)[:, 0]
    np.testing.assert_allclose(res.logprobs[i, : len(resp)], want, atol=1e-4)
    np.testing.assert_allclose(hidden[i, : len(resp)],
                               out.hidden_BxTxD[i, len(prompt): len(seqs[i])], atol=1e-4)
    np.testing.assert_allclose(prompt_hidden[i], out.hidden_BxTxD[i, len(prompt) - 1],
                               atol=1e-4)
    assert not np.any(hidden[i, len(resp):])  # nothing past the end


def test_first_token_distribution_matches_processed_distribution():
  """Chi-square at significance 1e-3 over 4000 samples of one prompt, vocabulary 12."""
  m = init_model(small_config(vocab_size=12), seed=3)
  params = SamplingParams(temperature=0.8, top_k=6, max_new_tokens=1)
  res = _engine(m, batch_buckets=(64,), max_batch=64).generate([[3, 4, 5]], 4000, params,
                                                                jax.random.key(5))
  probs = np.exp(np.asarray(processed_logprobs(m(jnp.asarray([[3, 4, 5]])).logits_BxTxV[0, -1],
                                               params)))
  counts = np.bincount(res.tokens[:, 0], minlength=12)
  assert chi_square_pvalue(counts, probs) > 1e-3
  wrong = np.exp(np.asarray(processed_logprobs(m(jnp.asarray([[3, 4, 5]])).logits_BxTxV[0, -1],
                                               SamplingParams(temperature=1.0, top_k=6))))
  assert chi_square_pvalue(counts, wrong) < 1e-3


def test_bad_input_is_a_clear_error_before_work(model):
  eng = _engine(model)
  params = SamplingParams(max_new_tokens=8)
  with pytest.raises(ValueError, match="exceeds the model context"):
    eng.generate([[3] * 60], 1, params, jax.random.key(0))
  with pytest.raises(ValueError, match="group_size"):
    eng.generate([[3]], 0, params, jax.random.key(0))
  with pytest.raises(ValueError, match="not covered by batch_buckets"):
    EngineConfig(batch_buckets=(1, 2, 4), max_batch=8)
  with pytest.raises(ValueError, match="largest prefill bucket"):
    _engine(model, prefill_buckets=(8,)).generate([[3] * 9], 1, params, jax.random.key(0))
  assert len(eng.pool) == 0  # nothing was compiled


def test_pool_reuses_executables_for_new_weights(model):
  eng = _engine(model)
  params = SamplingParams(temperature=1.0, max_new_tokens=8, stop_tokens=STOPS)
  a = eng.generate(_prompts(2), 1, params, jax.random.key(0))
  n = len(eng.pool)
  _, state = nnx.split(init_model(small_config(), seed=9))
  eng.weights.set_policy(state)
  b = eng.generate(_prompts(2), 1, params, jax.random.key(0))
  assert len(eng.pool) == n and not np.array_equal(a.tokens, b.tokens)
  assert eng.pool.report()["executables"] == n


@pytest.mark.long
def test_shards_and_mesh_weights_in_a_2_device_subprocess():
  out = run_on_fake_devices("tests.rollout.shard_worker")
  assert out == {"greedy_equal": True, "sampled_equal": True, "each_program_compiled_once": True,
                 "no_recompile": True, "sync_bytes_exact": True,
                 "mesh_weights_equal": True, "two_shards_idle_reported": True,
                 "executable_cache_per_shard": True}


@pytest.mark.long
def test_a_tensor_parallel_shard_gives_the_tokens_of_one_device():
  """A shard of tp = 2 devices (heads, MLP and KV cache split over them) decodes the tokens one
  device does, plainly and speculatively, through the xla and the pallas attention paths
  (2 fake devices, a subprocess)."""
  out = run_on_fake_devices("tests.rollout.tp_worker")
  assert out["plain_equal"] and out["suffix_equal"] and out["pallas_equal"]
  # Lowered for a GPU, the decode program's kernel (one call, as the model's layers share it)
  # takes 1 of the model's 2 kv heads: each device reads its own half of the cache.
  assert out["gpu_kernel_calls"] >= 1 and out["gpu_kernel_kv_heads"] == [1]
  # Summing a layer's output over two devices reorders float additions: log-probs move by
  # rounding only.
  assert max(out["plain_logprob_diff"], out["suffix_logprob_diff"]) < 1e-4
  # Each layer's q/k/v, o, gate/up and down kernels (the 53-token vocabulary does not split).
  assert out["kernels_split"] == 2 * 4
  assert out["decode_programs"] > 0 and out["cache_split_in_every_decode_program"]
  assert out["bad_tp"].startswith("tp=2 does not divide the model's n_kv_heads=1")
  # The drafter's embedding and head: the shard's own arrays on a one-device shard, a whole copy
  # on the first device of a tp shard.
  assert out["tp1_tokens_whole_on_first_device"] and out["tp2_tokens_whole_on_first_device"]
  assert out["tp1_tokens_shared"]


def test_after_warm_up_no_call_compiles_whatever_its_prompt_lengths(model):
  """The cache length is fixed by `max_prompt_len`: calls whose longest prompts need different
  prefill buckets run programs that `warm_up` built, and give the tokens of a per-call layout."""
  params = SamplingParams(temperature=1.0, max_new_tokens=8, stop_tokens=STOPS)
  eng = _engine(model, prefill_buckets=(4, 8, 16), max_prompt_len=14)
  calls = [[[5, 6], [7, 8, 9]], [[5] * 7, [6] * 2], [[4] * 14, [3] * 5, [8]]]  # buckets 4, 8, 16
  report = eng.warm_up([(2, 3), (3, 3)], params, [1, 14], progress=False)
  assert report["programs"] > 0
  built = compiles.Since()
  outs = [eng.generate(p, 3, params, jax.random.key(i)) for i, p in enumerate(calls)]
  assert built.events == 0 and all(o.timeline.summary()["compile_events"] == 0 for o in outs)
  per_call = _engine(model, prefill_buckets=(4, 8, 16))
  for i, (p, o) in enumerate(zip(calls, outs)):
    np.testing.assert_array_equal(o.tokens,
                                  per_call.generate(p, 3, params, jax.random.key(i)).tokens)
  with pytest.raises(ValueError, match="max_prompt_len"):
    eng.generate([[3] * 15], 1, params, jax.random.key(0))
  with pytest.raises(ValueError, match="needs EngineConfig.max_prompt_len"):
    per_call.warm_up([(1, 1)], params, [3], progress=False)


def test_programs_from_jax_s_persistent_cache_are_not_written_to_the_executable_cache(tmp_path):
  """On CPU a program JAX deserialised from its persistent cache does not serialise whole again
  (a later process that loaded it crashed with 'Function ... not found'): the pool writes only
  programs it compiled. Pool a compiles and writes; pool b gets the same program from JAX's
  cache and writes nothing; a new pool loads a's entry and computes the same values."""
  x = jnp.linspace(0.0, 1.0, 16)
  build = lambda: (lambda v: jnp.cumsum(jnp.sin(v) ** 2) * 3.0,
                   (jax.ShapeDtypeStruct((16,), jnp.float32),), ())
  previous = jax.config.jax_compilation_cache_dir
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax"))
  compilation_cache.reset_cache()
  try:
    a = ExecutablePool(cache_dir=str(tmp_path / "a"))
    want = np.asarray(a.get("k", build)(x))
    b = ExecutablePool(cache_dir=str(tmp_path / "b"))
    np.testing.assert_array_equal(np.asarray(b.get("k", build)(x)), want)
  finally:
    jax.config.update("jax_compilation_cache_dir", previous)
    compilation_cache.reset_cache()
  assert len(list((tmp_path / "a" / "executables").iterdir())) == 1
  assert not (tmp_path / "b").exists()
  again = ExecutablePool(cache_dir=str(tmp_path / "a"))
  np.testing.assert_array_equal(np.asarray(again.get("k", build)(x)), want)
  assert [e.loaded for e in again.events] == [True]
