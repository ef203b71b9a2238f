"""The drafter as it will be served (`experiments/configs/bench_served.py` says what runs): its
tokens per step in our engine, its exported folder's imported back, and the same folder's in a
PyTorch loop (`experiments/benchmarks/served.py`); the last line is one JSON object.

  python -m experiments.bench_served --config=experiments/configs/bench_served.py

Needs the test extra (torch, transformers, speculators: `make test` installs them).
"""

import json
import time

from ml_collections import config_flags

from experiments import launch
from tlt_jax.drafter.warmup import load_any_drafter, resolve_drafter
from tlt_jax.errors import ConfigError
from tlt_jax.hashing import git_commit
from tlt_jax.workloads import build_workload, starting_policy, workload_config

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/bench_served.py")


def main(argv):
  del argv
  c, b = _CONFIG.value, _CONFIG.value.bench
  try:
    from experiments.benchmarks import served
  except ImportError as e:
    raise ConfigError(f"experiments.bench_served needs the test extra ({e.name} is missing): "
                      "pip install -e '.[test]' (or make test).") from None
  wc = workload_config(c)
  policy = starting_policy(wc)
  w = build_workload(wc, b.num_prompts, c.seed, policy=policy, split="test")
  drafter, _ = load_any_drafter(resolve_drafter(b.drafter), w.model)
  out = served.served_acceptance(w.model, drafter, w.prompts, w.params.max_new_tokens, c.out_dir,
                                 b.depth, w.tokenizer)
  for note in out["notes"]:
    print(f"[bench_served] the served drafter: {note}")
  print(f"[bench_served] tokens per step, greedy chain of {b.depth} over {len(w.prompts)} held-out "
        f"prompts: ours {out['ours']}, its export in our engine {out['served_in_our_engine']}, "
        f"in PyTorch {out['served_in_pytorch']}")
  print(json.dumps({**out, "drafter": b.drafter, "model": wc.name, "commit": git_commit()[0],
                    "date": time.strftime("%Y-%m-%d")}))


if __name__ == "__main__":
  launch.run(main)
