"""Run by test_engine with 2 fake CPU devices: a rollout on one tensor-parallel shard (tp = 2),
through either attention path, against the same rollout on one device."""

import json
import re

import jax
import numpy as np
from jax.sharding import PartitionSpec

from tests.conftest import lower_for_gpu
from tests.spec.test_spec_engine import STOPS, _prompts, peaked_model
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.rollout.programs import Layout
from tlt_jax.spec.strategy import SpecConfig, Strategy


def main():
  assert jax.device_count() == 2
  # The peaked model's top-2 logit gaps exceed the noise of summing over devices in another order.
  model = peaked_model()
  # Two batch buckets (8 rows compact to 2): compaction runs, with half the programs of four.
  cfg = dict(batch_buckets=(2, 8), max_batch=8, steps_per_dispatch=3, precompile=False)
  greedy = SamplingParams(temperature=0.0, max_new_tokens=20, stop_tokens=STOPS)
  prompts = _prompts(5)
  # A strict health check retires the arm early, so plain decode programs run too.
  spec = SpecConfig(arms=(Strategy("suffix", depth=3, ngram=2),), threshold=8,
                    min_accept_len=1.15, health_window=16)
  out = {}
  for name, s in (("plain", None), ("suffix", spec)):
    one = RolloutEngine(model, EngineConfig(num_shards=1, **cfg), spec=s)
    tp = RolloutEngine(model, EngineConfig(num_shards=1, tp=2, **cfg), spec=s)
    a = one.generate(prompts, 2, greedy, jax.random.key(0))
    b = tp.generate(prompts, 2, greedy, jax.random.key(0))
    out[f"{name}_equal"] = bool(np.array_equal(a.tokens, b.tokens))
    out[f"{name}_logprob_diff"] = float(np.abs(a.logprobs - b.logprobs).max())
  # The Pallas attention path: each device's kernel reads its own kv heads of the split cache.
  pallas = RolloutEngine(model, EngineConfig(num_shards=1, tp=2, attention="pallas", **cfg),
                         spec=spec)
  out["pallas_equal"] = bool(np.array_equal(
      a.tokens, pallas.generate(prompts, 2, greedy, jax.random.key(0)).tokens))
  key = next(k for k in pallas.pool.keys() if k[0] == "decode")  # (name, shard, b, layout, params)
  programs = pallas.programs
  # The decode program as `programs.in_mesh` traces it, under the shard's mesh, of GPUs here.
  fn, args, _ = programs.decode(0, key[2], Layout(*key[3:9]), key[9])[1]()
  text = lower_for_gpu(jax.jit(fn), *args, mesh=programs.meshes[0])
  calls = [line for line in text.splitlines() if "custom_call" in line and "triton" in line]
  out["gpu_kernel_calls"] = len(calls)
  out["gpu_kernel_kv_heads"] = sorted({int(re.search(r"\(tensor<\d+x(\d+)x", c).group(1))
                                       for c in calls})
  weights, _ = tp.weights.shard(0)
  out["kernels_split"] = sum(not x.sharding.is_fully_replicated and len(x.sharding.device_set) == 2
                             for x in jax.tree.leaves(weights))
  # The decode programs take the KV cache split over kv heads: [B, K, ...] with K over tp.
  decode = [tp.pool.get(k, None) for k in tp.pool.keys() if k[0] == "decode"]
  out["decode_programs"] = len(decode)
  out["cache_split_in_every_decode_program"] = all(
      sum(sh.spec == PartitionSpec(None, "tp") for sh in jax.tree.leaves(c.input_shardings))
      == 2 * model.cfg.n_layers for c in decode)
  # What the drafter reads of the policy: the embedding and head whole on the shard's first
  # device, the shard's own buffers when it is one device.
  embed = np.asarray(model.embed.embedding[...])
  for name, eng in (("tp1", one), ("tp2", tp)):
    tokens = eng.drafter_port().token_params(0)["embed"]["embedding"]
    held = eng.weights.shard(0)[0]["embed"]["embedding"]
    out[f"{name}_tokens_whole_on_first_device"] = (
        tokens.sharding.device_set == {eng.devices[0]} and np.array_equal(tokens, embed))
    out[f"{name}_tokens_shared"] = (tokens.unsafe_buffer_pointer()
                                    == held.addressable_shards[0].data.unsafe_buffer_pointer())
  try:
    RolloutEngine(peaked_model(n_kv_heads=1, n_heads=4), EngineConfig(tp=2, **cfg))
  except ValueError as e:
    out["bad_tp"] = str(e)
  print(json.dumps(out))


if __name__ == "__main__":
  main()
