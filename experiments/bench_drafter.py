"""The adaptive-drafter benchmark; the last line is one JSON object.

  XLA_FLAGS=--xla_force_host_platform_device_count=2 \
    python -m experiments.bench_drafter --config=experiments/configs/bench_drafter.py

The policy drifts through GRPO steps (the config states how much); the same run is made with the
warm-up drafter frozen and with the adaptive drafter, whose spot trainer uses the rollout shards
that finish early. On this CPU the "devices" are fake and share two cores: the overhead is
measured, not assumed free.
"""

import os

from experiments import fake_devices

fake_devices.use(2)  # two rollout shards need two devices; on CPU they are faked, before jax

import json  # noqa: E402

import numpy as np  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from experiments import launch  # noqa: E402
from experiments.benchmarks.drafter import accept_len, hidden_state_error  # noqa: E402
from tlt_jax.rl.config import run_config  # noqa: E402
from tlt_jax.rl.run import build_trainer  # noqa: E402
from tlt_jax.workloads import build_drafter, build_workload, starting_policy  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/bench_drafter.py")


def main(argv):
  del argv
  c = _CONFIG.value
  rc, b = run_config(c, other_keys=("bench",)), c.bench
  policy = starting_policy(rc.workload)  # loaded once
  drafter0, _ = build_drafter(rc.workload, rc.drafter, rc.seed, policy=policy)
  w = build_workload(rc.workload, rc.num_prompts, rc.seed, policy=policy)
  held = build_workload(rc.workload, b.eval_prompts, rc.seed + 7919, policy=policy, split="test")
  pad = w.tokenizer.pad_id

  def measure(policy, drafter):
    return accept_len(policy, drafter, held.prompts, b.eval_group_size, w.params, rc.engine,
                      b.measure_depth, pad)

  initial, _ = measure(w.model, drafter0)
  print(f"[bench_drafter] accepted length of the warm-up drafter on the initial policy: "
        f"{initial:.3f}", flush=True)
  runs = {}
  for name in ("frozen", "adaptive"):
    run = c.copy_and_resolve_references()
    run.out_dir = os.path.join(c.out_dir, name)
    if name == "frozen":
      run.drafter.adaptive = {}
    trainer = build_trainer(run_config(run, other_keys=("bench",)))
    history = trainer.run()
    if len(history) != rc.loop.steps:
      raise SystemExit(f"{run.out_dir} already holds a run: delete it to re-run the benchmark.")
    runs[name] = (trainer, history)
    print(f"[bench_drafter] {name}: {rc.loop.steps} steps", flush=True)
  (_, hf), (ta, ha) = runs["frozen"], runs["adaptive"]
  policy = ta.updater.model()
  frozen_final, _ = measure(policy, drafter0)
  adaptive_final, res = measure(policy, ta.adaptive.drafter())
  step_s = lambda h: float(np.mean([m["step_s"] - m["time/compile_s"] for m in h[1:]]))
  idle = float(sum(m["time/idle_device_s"] for m in ha))
  out = {
      "steps": rc.loop.steps, "drift": b.drift,
      "accept_len_initial": round(initial, 4),
      "accept_len_frozen_final": round(frozen_final, 4),
      "accept_len_adaptive_final": round(adaptive_final, 4),
      "frozen_loss_fraction": round(1 - frozen_final / initial, 4),
      "adaptive_kept_fraction": round(adaptive_final / initial, 4),
      "rewards_identical": [m["reward"] for m in hf] == [m["reward"] for m in ha],
      "hidden_state_max_err": hidden_state_error(policy, held.prompts, b.eval_group_size, res),
      "idle_time_used_fraction": round(float(sum(m["drafter/idle_used_s"] for m in ha)) / idle, 4)
      if idle else 0.0,
      "idle_device_s": round(idle, 3),
      "drafter_wall_overhead": round(step_s(ha) / step_s(hf) - 1, 4),
      "drafter_versions_published": ta.adaptive.publisher.version,
      "publish_refusals": sum(not e["accepted"] for e in ta.adaptive.publisher.events),
      "spot_steps": len(ta.adaptive.spot.log),
      "in_rollout_accept_len_frozen": [round(m["spec/accept_len"], 3) for m in hf],
      "in_rollout_accept_len_adaptive": [round(m["spec/accept_len"], 3) for m in ha],
      "devices": len(ta.engine.devices),
  }
  print(json.dumps(out))


if __name__ == "__main__":
  launch.run(main)
