"""The demo: the warm start (shipped; else cached, or trained), a GRPO baseline run whose first
held-out evaluation gives the task's properties, and a TLT run of its first steps (see
experiments/configs/demo.py); `reward_curves.png` and `rollout_anatomy.png` of the pair go into
`out_dir` (`make pictures` copies them to docs/images for the README).

  python -m experiments.demo --config=experiments/configs/demo.py
Re-running it resumes or reuses the runs under `out_dir`. The last line printed is one JSON object.
"""

import os

from experiments import fake_devices

fake_devices.use(2)  # two rollout shards need two devices; on CPU they are faked, before jax

import json  # noqa: E402
import time  # noqa: E402

from ml_collections import config_flags  # noqa: E402

from experiments import launch  # noqa: E402
from tlt_jax import sft  # noqa: E402
from tlt_jax.hashing import provenance  # noqa: E402
from tlt_jax.rl import pictures  # noqa: E402
from tlt_jax.rl.compare import read_metrics  # noqa: E402
from tlt_jax.rl.config import run_config  # noqa: E402
from tlt_jax.rl.run import run_pair  # noqa: E402

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
  _, summary = sft.warm_start(c.warm_start)
  print(f"[demo] warm start {provenance(summary)}: {summary['cache']}")
  pair = run_pair(*runs)
  # The baseline's evaluation before its first step is of the warm start: the task's properties.
  ev = next(m for m in read_metrics(runs[0].out_dir) if "eval/accuracy" in m)
  stats = {k.removeprefix("eval/"): v for k, v in ev.items() if k.startswith("eval/")}
  print(f"[demo] warm start on {pair['heldout_prompts']} held-out prompts x "
        f"{runs[0].loop.eval_group_size} samples at temperature {runs[0].workload.temperature}: "
        f"accuracy {stats['accuracy']:.3f}, response length p50 {stats['length_p50']:.0f} / p99 "
        f"{stats['length_p99']:.0f}, mixed-reward groups {stats['mixed_group_fraction']:.2f}")
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
  drawn = []
  for draw in (pictures.reward_curves, pictures.rollout_anatomy):
    drawn.append(os.path.join(c.out_dir, f"{draw.__name__}.png"))
    draw(runs[0].out_dir, runs[1].out_dir, drawn[-1])
  print(f"[demo] pictures: {', '.join(drawn)}")
  print(json.dumps({"warm_start_accuracy": stats["accuracy"], **stats, **pair,
                    "pictures": drawn, "wall_s": round(time.time() - start, 1)}))


if __name__ == "__main__":
  launch.run(main)
