"""Compares a TLT run with its baseline (same config and seed); the last line is one JSON object.
It compares a 1-process and an N-process run of the same config the same way (the second
directory in place of the TLT run): identical rewards, and the N-process run's speed relative.

  python -m experiments.compare_runs runs/tiny_baseline runs/tiny_tlt
"""

import json

from absl import app, flags

from experiments import launch
from tlt_jax.rl.compare import compare_runs

_SKIP = flags.DEFINE_integer("skip_first", 1, "Leave this many first steps (compilation) out of "
                             "the timing figures; rewards are compared on every step.")


def main(argv):
  if len(argv) != 3:
    raise app.UsageError("Usage: python -m experiments.compare_runs BASELINE_DIR TLT_DIR")
  try:
    out = compare_runs(argv[1], argv[2], skip_first=_SKIP.value)
  except FileNotFoundError as e:
    raise app.UsageError(str(e)) from None
  rewards = ("identical" if out["rewards_identical"]
             else f"differ by up to {out['reward_max_abs_diff']:g}")
  print(f"[compare] {out['steps']} common steps; rewards {rewards}; "
        f"end-to-end {out['e2e_speedup']:.3f}x, rollout {out['rollout_speedup']:.3f}x at a rollout "
        f"share of {out['rollout_share']:.2f}; Amdahl bound {out['amdahl_bound']:.3f}x")
  print(json.dumps(out))


if __name__ == "__main__":
  launch.run(main)
