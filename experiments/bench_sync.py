"""What a weight sync moves with several processes: the policy from the update's layout onto each
process's rollout shards, gathered whole on each process's first device and placed from there
(the trainer's sync until the resharding), and resharded (`tlt_jax/rollout/reshard.py`, its sync
now), for a data-parallel and an fsdp update mesh and rollout shards of tp 1 and 2. Run it in
every process of a group, e.g. 2 processes x 2 CPU devices:

  python -m experiments.launch_local --num_processes=2 --devices_per_process=2 -- \\
      python -m experiments.bench_sync --preset=tiny

Bytes are those that arrive at this process's devices (`reshard.moved_bytes`), for process 0;
seconds the median of `--repeats` syncs after one untimed. Prints a row per layout and, last,
one JSON object (process 0).
"""

import json
import time

import jax
import numpy as np
from absl import flags
from flax import nnx

from experiments import launch
from tlt_jax import distributed
from tlt_jax.models import get_preset, init_model
from tlt_jax.models.precision import compute_copy
from tlt_jax.models.sharding import make_mesh, param_shardings
from tlt_jax.rollout.reshard import moved_bytes
from tlt_jax.rollout.shards import placed_shapes, replicated, shard_meshes
from tlt_jax.rollout.weights import WeightStore

_PRESET = flags.DEFINE_string("preset", "tiny", "the policy's model preset (random weights)")
_DTYPE = flags.DEFINE_string("dtype", "float32", "the rollout's compute dtype")
_REPEATS = flags.DEFINE_integer("repeats", 5, "timed syncs per layout")


def _gathered(state, mesh, meshes, dtype) -> tuple[list, int]:
  """The sync by gathering: whole on this process's first device, then placed on each shard."""
  local = distributed.local_copy(state, mesh)
  copy = compute_copy(local, dtype)
  shards = [jax.device_put(copy, param_shardings(copy, m)) for m in meshes]
  whole = placed_shapes(state, jax.tree.map(lambda x: replicated(mesh), state))
  moved = moved_bytes(state, whole) + sum(
      moved_bytes(local, placed_shapes(copy, param_shardings(copy, m))) for m in meshes)
  return shards, moved


def _seconds(sync) -> float:
  sync()
  times = []
  for _ in range(_REPEATS.value):
    t0 = time.perf_counter()
    jax.block_until_ready(sync())
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def main(argv):
  del argv
  distributed.initialize()
  state = nnx.state(init_model(get_preset(_PRESET.value), seed=0))
  dtype, local = _DTYPE.value, len(jax.local_devices())
  rows = []
  for update in ((-1, 1, 1), (1, -1, 1)):
    mesh = make_mesh(*update)
    placed = jax.tree.map(distributed.put, state, param_shardings(state, mesh))
    for tp in (1, 2):
      meshes = shard_meshes(jax.local_devices(), local // tp, tp)
      store = WeightStore(meshes, state, dtype=dtype)
      gather_s = _seconds(lambda: _gathered(placed, mesh, meshes, dtype)[0])
      gather_bytes = _gathered(placed, mesh, meshes, dtype)[1]
      reshard_s = _seconds(lambda: (store.set_policy(placed),
                                    [store.shard(s)[0] for s in range(len(meshes))])[1])
      rows.append({"update_mesh": list(mesh.devices.shape), "rollout_tp": tp,
                   "shards_per_process": local // tp, "gather_bytes": gather_bytes,
                   "reshard_bytes": store.sync_bytes, "gather_s": round(gather_s, 5),
                   "reshard_s": round(reshard_s, 5)})
  if distributed.is_writer():
    policy = sum(x.nbytes for x in jax.tree.leaves(state))
    print(f"[bench_sync] {_PRESET.value}: {policy / 1e6:.2f} MB of parameters, "
          f"{jax.process_count()} processes x {local} devices, rollout in {dtype}")
    for r in rows:
      print(f"[bench_sync] update mesh {tuple(r['update_mesh'])}, rollout tp={r['rollout_tp']}: "
            f"gather {r['gather_bytes'] / 1e6:.2f} MB in {r['gather_s'] * 1e3:.1f} ms, "
            f"reshard {r['reshard_bytes'] / 1e6:.2f} MB in {r['reshard_s'] * 1e3:.1f} ms")
    print(json.dumps({"preset": _PRESET.value, "policy_bytes": policy, "dtype": dtype,
                      "processes": jax.process_count(), "devices_per_process": local,
                      "layouts": rows}))


if __name__ == "__main__":
  launch.run(main)
