"""Run in a subprocess with 2 fake CPU devices by test_engine: shards and mesh-sharded weights."""

import collections
import json
import tempfile

import jax
import numpy as np
from flax import nnx

from tests.conftest import small_config
from tlt_jax.models import init_model
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.models.sharding import make_mesh, param_shardings
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.rollout.plain import generate_plain


def main():
  assert jax.device_count() == 2
  # Programs come from compiles here, not JAX's persistent cache: the pool moves only programs
  # it compiled itself (it cannot reserialise a cached one), and the test counts compiles.
  jax.config.update("jax_enable_compilation_cache", False)
  model = init_model(small_config(), seed=0)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(3, 53, size=int(rng.integers(2, 14))).tolist() for _ in range(5)]
  # Two batch buckets (a shard's 5 rows compact to 2): compaction runs, with half the programs
  # of four.
  cfg = dict(batch_buckets=(2, 8), max_batch=8, steps_per_dispatch=3, precompile=False)
  one = RolloutEngine(model, EngineConfig(num_shards=1, **cfg))
  two = RolloutEngine(model, EngineConfig(num_shards=2, **cfg))
  greedy = SamplingParams(temperature=0.0, max_new_tokens=20, stop_tokens=(7, 9, 11))
  ref = generate_plain(model, [p for p in prompts for _ in range(2)], jax.random.key(0), greedy)
  r2 = two.generate(prompts, 2, greedy, jax.random.key(0))
  out = {"greedy_equal": bool(np.array_equal(r2.tokens, ref.tokens))}
  sampled = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=20, stop_tokens=(7, 9, 11))
  a = one.generate(prompts, 2, sampled, jax.random.key(3))
  b = two.generate(prompts, 2, sampled, jax.random.key(3))
  out["sampled_equal"] = bool(np.array_equal(a.tokens, b.tokens))
  # Each program is compiled on the first shard that needs it and moved onto the other.
  counts = collections.Counter(e.key[:1] + e.key[2:] for e in two.pool.events if not e.relocated)
  out["each_program_compiled_once"] = (set(counts.values()) == {1}
                                       and len(two.pool) > len(counts))
  # Weights laid out by a (data=1, fsdp=2) mesh, as the trainer holds them, feed the engine.
  _, state = nnx.split(model)
  mesh = make_mesh(1, 2)
  sharded = jax.device_put(state, param_shardings(state, mesh))
  n = len(two.pool)
  two.weights.set_policy(sharded)
  c = two.generate(prompts, 2, sampled, jax.random.key(3))
  out["no_recompile"] = len(two.pool) == n
  # Each shard's device received the halves of the fsdp-split weights it did not hold, and no
  # byte of the weights it held whole.
  split = sum(x.nbytes for x in jax.tree.leaves(sharded) if not x.sharding.is_fully_replicated)
  out["sync_bytes_exact"] = two.weights.sync_bytes == split > 0
  out["mesh_weights_equal"] = bool(np.array_equal(c.tokens, b.tokens))
  out["two_shards_idle_reported"] = len(c.timeline.summary()["shard_idle_s"]) == 2
  # Executables cached on disk load back in a new engine (shard 0's; shard 1 moves them).
  with tempfile.TemporaryDirectory() as cache:
    runs = []
    for _ in range(2):
      eng = RolloutEngine(model, EngineConfig(num_shards=2, compile_cache_dir=cache, **cfg))
      runs.append((eng.generate(prompts, 2, sampled, jax.random.key(3)), eng.pool.events))
    out["executable_cache_per_shard"] = (
        all(e.loaded == (e.key[1] == 0) for e in runs[1][1])
        and not any(e.loaded for e in runs[0][1]) and np.array_equal(runs[1][0].tokens, b.tokens))
  print(json.dumps(out))


if __name__ == "__main__":
  main()
