"""Run by test_multiprocess as one process on one device, or as several processes of 2 devices
(`experiments.launch_local`): the rollout of 6 prompts x 2 samples, greedy and sampled, spread
over the processes, and a sampled one under prompt-addressed noise that replays the first halves
of its own earlier responses; process 0 prints every row's tokens and lengths as JSON. With
several processes each has one rollout shard of tp = 2, and the engines' weights come from the
model's state laid out as an update does (fsdp over every device of every process), resharded
into the shard (`rollout/reshard.py`), but for the replaying engine's, from an update on one
device of each process, which the shard's devices are not (so gathered first); the worker
reports how each rollout weight is split, the bytes the syncs moved and the row tiles
invariant numerics would run (`invariant.model_tiles`)."""

import json

import jax
import numpy as np

from flax import nnx

from tests.conftest import small_config
from tlt_jax import distributed
from tlt_jax.models import init_model, invariant
from tlt_jax.models.sharding import make_mesh, param_shardings
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.rollout.history import HistoryConfig, ReplayConfig
from tlt_jax.rollout.noise import PromptNoise
from tlt_jax.rollout.spread import generate_spread


def main():
  distributed.initialize()
  model = init_model(small_config(), seed=0)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(3, 53, size=int(rng.integers(2, 14))).tolist() for _ in range(6)]
  tp = 2 if jax.process_count() > 1 else 1
  # One batch bucket: half the programs of two (compaction under tp is tp_worker's test).
  layout = EngineConfig(batch_buckets=(16,), max_batch=16, steps_per_dispatch=4,
                        precompile=False, tp=tp)
  engine = RolloutEngine(model, layout)
  out = {"processes": jax.process_count(),
         "row_tiles": invariant.model_tiles(model.cfg)}
  if tp > 1:
    state = nnx.state(model)  # as the update holds it: split over every device of every process
    updated = jax.tree.map(distributed.put, state, param_shardings(state, make_mesh(1, -1, 1)))
    engine.weights.set_policy(updated)
    out["split"] = split_report(engine.weights.shard(0)[0])
    out["sync_bytes"] = engine.weights.sync_bytes
    out["policy_bytes"] = sum(x.nbytes for x in jax.tree.leaves(state))
  for name, temperature in (("greedy", 0.0), ("sampled", 1.0)):
    params = SamplingParams(temperature=temperature, top_p=0.9, max_new_tokens=20,
                            stop_tokens=(7, 9, 11))
    spread = generate_spread(engine, prompts, 2, params, jax.random.key(3))
    out[name] = {"tokens": spread.whole.tokens.tolist(),
                 "lengths": spread.whole.lengths.tolist(),
                 "local_rows": len(spread.local.lengths)}
  replaying = RolloutEngine(model, layout, replay=ReplayConfig(
      "prompt", history=HistoryConfig(max_tokens=10_000, chunk=4)))
  if tp > 1:  # from an update on one device of each process: not the shard's, so gathered
    one_each = param_shardings(state, make_mesh(1, jax.process_count(), 1))
    replaying.weights.set_policy(jax.tree.map(distributed.put, state, one_each))
    out["gathered_sync_bytes"] = replaying.weights.sync_bytes
  addresses = PromptNoise().addresses(prompts, 2)
  first = generate_spread(replaying, prompts, 2, params, jax.random.key(3), addresses=addresses)
  stored = [first.whole.response(i)[: first.whole.lengths[i] // 2] for i in range(12)]
  again = generate_spread(replaying, prompts, 2, params, jax.random.key(3), addresses=addresses,
                          replay=stored)
  out["replayed"] = {"tokens": again.whole.tokens.tolist(), "lengths": again.whole.lengths.tolist(),
                     "local_rows": len(again.local.lengths),
                     "same_as_first": bool(np.array_equal(again.whole.tokens, first.whole.tokens)),
                     "replay_fraction": again.local.timeline.summary()["replay_fraction"]}
  if distributed.is_writer():
    print(json.dumps(out))


def split_report(policy) -> dict:
  """A shard's layer matrices (its projections), and the names of those that one of its devices
  holds whole."""
  projections, whole = 0, []
  for path, var in nnx.to_flat_state(policy):
    x = var.get_value()
    if path[0] == "layers" and x.ndim >= 2:
      projections += 1
      if any(s.data.shape == x.shape for s in x.addressable_shards):
        whole.append("/".join(map(str, path)))
  return {"projections": projections, "whole": whole}


if __name__ == "__main__":
  main()
