"""The GPU proof: SmolLM2 with the shipped drafter on one GPU, from the offline bundle
(`make gpu-bundle`, docs/GPU.md). Runs the phases of `experiments/benchmarks/proof.py` in order
of value, writing each phase's JSON to `out_dir/<phase>.json` as it finishes (a phase already
there is skipped: a second call goes on where the first stopped), then `out_dir/proof.md`, a
Markdown table for docs/BENCHMARKS.md; the last line is one JSON object. A phase that ran out
of time lists its `skipped` cells, and the next call goes on with them.

  python -m experiments.gpu_proof [--out_dir=DIR] [--phases=costs,rollouts,...]
  python -m experiments.gpu_proof --dry_run --out_dir=DIR   # CPU, toy sizes, every phase
"""

import json
import os
import sys
import time

from experiments import gpu_bundle, wheels

# On a bare GPU box the bundle's wheels come first: the imports below need them.
if "--dry_run" not in sys.argv:
  wheels.ensure(wheels_dir=os.path.join(gpu_bundle.BUNDLE_DIR, "wheels"),
                command="python -m experiments.gpu_proof")

import jax  # noqa: E402
from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from experiments import launch  # noqa: E402
from experiments.benchmarks import proof  # noqa: E402
from experiments.configs import gpu_proof as proof_config  # noqa: E402
from tlt_jax.errors import ConfigError  # noqa: E402
from tlt_jax.hashing import git_commit  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/gpu_proof.py")
_DRY = flags.DEFINE_bool("dry_run", False, "Every phase on CPU at toy sizes (the config's "
                         "dry_run variant).")
_OUT = flags.DEFINE_string("out_dir", None, "Where the phases' JSON go (default: the config's).")
_PHASES = flags.DEFINE_list("phases", list(proof.PHASES), "The phases to run, in this order.")


def main(argv):
  del argv
  c = proof_config.get_config("dry_run") if _DRY.value else _CONFIG.value
  c.out_dir = _OUT.value or c.out_dir
  unknown = sorted(set(_PHASES.value) - set(proof.PHASES))
  if unknown:
    raise ConfigError(f"--phases: unknown {unknown}; the phases are {', '.join(proof.PHASES)}.")
  device = jax.devices()[0]
  if c.require_gpu and device.platform != "gpu":
    raise ConfigError(f"experiments.gpu_proof needs a GPU and jax {jax.__version__} sees "
                      f"{device.platform} devices; on CPU run it with --dry_run.")
  if not _DRY.value and not c.model_path and os.path.isdir(gpu_bundle.BUNDLE_DIR):
    c.model_path = next(iter(gpu_bundle.join().values()))
  os.makedirs(c.out_dir, exist_ok=True)
  start = time.perf_counter()
  ctx = proof.Context(c, None, None, results={}, deadline=start + c.budget_s if c.budget_s
                      else float("inf"))
  failed = proof.run_phases(ctx, _PHASES.value)
  commit, dirty = git_commit()
  header = (f"Device: {device.device_kind} ({device.platform}), jax {jax.__version__}, commit "
            f"{commit}{' (dirty)' if dirty else ''}, {time.strftime('%Y-%m-%d')}; `python -m "
            f"experiments.gpu_proof"
            f"{' --dry_run' if _DRY.value else ''}`.")
  table = proof.markdown(ctx.results, header)
  with open(os.path.join(c.out_dir, "proof.md"), "w") as f:
    f.write(table)
  print(table)
  print(json.dumps({"device": device.device_kind, "out_dir": c.out_dir,
                    "phases": [p for p in _PHASES.value if p in ctx.results], "failed": failed,
                    "seconds": round(time.perf_counter() - start, 1)}))
  if failed:  # after the tables: what finished is written
    sys.exit(1)


if __name__ == "__main__":
  launch.run(main)
