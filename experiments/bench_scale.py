"""What the multi-process runtime costs: the same TLT run as 1 process x 2 devices and as
2 processes x 1 device (`experiments.launch_local`; both: data parallelism 2 in the update, two
rollout shards), each a fresh run. Prints both wall times and their ratio, and per step (first
step left out) the seconds and bytes of the cross-process collectives (the rollout's gather)
and of the weight sync; last line one JSON
object. The rewards of the two runs must be identical (the `coupled` rule).

  python -m experiments.bench_scale
  python -m experiments.bench_scale --run_config=experiments/configs/tiny_tlt.py:scale \\
      --out_dir=runs/bench_scale
"""

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
from absl import flags

from experiments import fake_devices, launch
from tlt_jax.rl.compare import read_metrics

_RUN = flags.DEFINE_string("run_config", "experiments/configs/tiny_tlt.py:scale",
                           "the run's config (as train_grpo's --config)")
_OUT = flags.DEFINE_string("out_dir", "runs/bench_scale", "where the two runs go (replaced)")

_STEP_KEYS = ("step_s", "rollout_s", "time/update_s", "time/weight_sync_s", "time/collective_s",
              "train/collective_bytes", "train/sync_bytes")


def _timed(command: list[str], env: dict) -> float:
  t0 = time.perf_counter()
  proc = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        text=True)
  if proc.returncode:
    raise SystemExit(f"{' '.join(command[:8])} failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
  return time.perf_counter() - t0


def _figures(out_dir: str, wall_s: float) -> dict:
  records = read_metrics(out_dir)
  with open(os.path.join(out_dir, "warmup.json")) as f:
    warmup_s = json.load(f)["warmup_s"]
  timed = records[1:] or records
  out = {"wall_s": round(wall_s, 2), "warmup_s": warmup_s, "steps": len(records)}
  out.update({f"{k.split('/')[-1]}_per_step": round(float(np.mean([r.get(k, 0) for r in timed])),
                                                    4)
              for k in _STEP_KEYS})  # the last-line JSON keys stay flat
  return out


def main(argv):
  del argv
  out = os.path.abspath(_OUT.value)
  shutil.rmtree(out, ignore_errors=True)
  train = [sys.executable, "-m", "experiments.train_grpo", f"--config={_RUN.value}"]
  one_env = dict(os.environ, XLA_FLAGS=fake_devices.xla_flags(2))
  one_s = _timed([*train, f"--config.out_dir={out}/one", "--config.train.mesh_shape=(2, 1)",
                  "--config.rollout.engine.num_shards=2"], one_env)
  two_s = _timed([sys.executable, "-m", "experiments.launch_local", "--num_processes=2",
                  "--devices_per_process=1", "--", *train, f"--config.out_dir={out}/two"],
                 dict(os.environ))
  one, two = _figures(f"{out}/one", one_s), _figures(f"{out}/two", two_s)
  rewards = [[r["reward"] for r in read_metrics(f"{out}/{d}")] for d in ("one", "two")]
  summary = {"one_process_x2": one, "two_processes_x1": two,
             "wall_ratio": round(two_s / one_s, 3),
             "step_ratio": round(two["step_s_per_step"] / one["step_s_per_step"], 3),
             "rewards_identical": rewards[0] == rewards[1]}
  for name, f in (("1 process x 2 devices", one), ("2 processes x 1 device", two)):
    print(f"[bench_scale] {name}: wall {f['wall_s']:.1f} s (warm-up {f['warmup_s']:.1f} s), "
          f"step {f['step_s_per_step']:.3f} s, collectives {f['collective_s_per_step']:.4f} s "
          f"and {f['collective_bytes_per_step'] / 1e6:.2f} MB, weight sync "
          f"{f['weight_sync_s_per_step']:.4f} s and {f['sync_bytes_per_step'] / 1e6:.2f} MB "
          "per step")
  print(f"[bench_scale] 2 processes / 1 process: wall {summary['wall_ratio']:.3f}x, step "
        f"{summary['step_ratio']:.3f}x; rewards identical: {summary['rewards_identical']}")
  print(json.dumps(summary))


if __name__ == "__main__":
  launch.run(main)
