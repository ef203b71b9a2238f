"""The demo: the warm start (shipped; else cached, or trained), the task's properties, then a
GRPO baseline run and a TLT run of its first steps (see experiments/configs/demo.py).

  python -m experiments.demo --config=experiments/configs/demo.py
Re-running it resumes or reuses the runs under `out_dir`. The last line printed is one JSON object.
"""

import os

# Two rollout shards need two devices; on CPU they are faked (set before jax is imported).
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_force_host_platform_device_count=2").strip()

import json  # noqa: E402
import time  # noqa: E402

from ml_collections import config_flags  # noqa: E402

from experiments import launch  # noqa: E402
from tlt_jax import sft  # noqa: E402
from tlt_jax.evaluation import evaluate_task  # noqa: E402
from tlt_jax.hashing import provenance  # noqa: E402
from tlt_jax.rl.config import run_config  # noqa: E402
from tlt_jax.rl.run import run_pair  # noqa: E402
from tlt_jax.tasks.arithmetic import TaskConfig  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/demo.py")


def main(argv):
  del argv
  c = _CONFIG.value
  start = time.time()
  c.warm_start.cache_dir = c.warm_start.cache_dir or c.cache_dir
  runs = []
  for name in ("baseline", "tlt"):  # the demo's own warm start, caches and run directories
    c[name].model.warm_start = c.warm_start
    c[name].out_dir = os.path.join(c.out_dir, name)
    c[name].cache_dir = c.cache_dir
    runs.append(run_config(c[name]))  # both runs' settings, checked before the warm start
  model, summary = sft.warm_start(c.warm_start)
  print(f"[demo] warm start {provenance(summary)}: {summary['cache']}")
  ev = c.eval
  stats = evaluate_task(model, TaskConfig.from_dict(c.warm_start.task),
                        num_prompts=ev.num_prompts, group_size=ev.group_size,
                        temperature=ev.temperature, seed=ev.seed)
  print(f"[demo] warm start, {ev.num_prompts} prompts x {ev.group_size} samples at temperature "
        f"{ev.temperature}: accuracy {stats['accuracy']:.3f}, response length p50 "
        f"{stats['length_p50']:.0f} / p99 {stats['length_p99']:.0f}, mixed-reward groups "
        f"{stats['mixed_group_fraction']:.2f}")
  pair = run_pair(*runs)
  print(f"[demo] GRPO, {pair['baseline_steps']} steps: held-out accuracy "
        f"{pair['heldout_before']:.3f} -> {pair['heldout_after']:.3f} on "
        f"{pair['heldout_prompts']} prompts (change {pair['heldout_gain']:+.3f}, standard error "
        f"{pair['heldout_se']:.3f}: {pair['heldout_gain_se']:.1f} SE)")
  print(f"[demo] TLT over the first {pair['steps']} steps: rewards "
        f"{'identical to' if pair['rewards_identical'] else 'differ from'} the baseline's "
        f"(max diff {pair['reward_max_abs_diff']:g}), accepted length {pair['accept_len']:.2f}, "
        f"rollout {pair['rollout_speedup']:.2f}x, end to end {pair['e2e_speedup']:.2f}x; the "
        f"rollout is {pair['rollout_share']:.0%} of a baseline step, so the Amdahl bound is "
        f"{pair['amdahl_bound']:.2f}x (tiny is a correctness workload, not memory-bound on CPU)")
  print(f"[demo] warm-up (every program built before the first step): baseline "
        f"{pair['warmup_s_baseline']:.1f} s, TLT {pair['warmup_s_tlt']:.1f} s")
  print(json.dumps({"warm_start_accuracy": stats["accuracy"], **stats, **pair,
                    "wall_s": round(time.time() - start, 1)}))


if __name__ == "__main__":
  launch.run(main)
