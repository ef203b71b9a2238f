"""Prints c(B, T) for a model and the machine's floors; last line one JSON object.

  python -m experiments.bench_cost --config=experiments/configs/bench_cost.py:smollm2
"""

import json

from absl import app
from ml_collections import config_flags

from tlt_jax.models.pretrained import load_policy
from tlt_jax.rollout.cost import cost_table, machine_floors, param_bytes

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/bench_cost.py")


def main(argv):
  del argv
  c = _CONFIG.value
  model = load_policy(c.model)
  floors = machine_floors()
  weights = param_bytes(model)
  floor_ms = 1e3 * weights / (floors["bandwidth_gb_s"] * 1e9)
  table = cost_table(model, c.batches, c.tokens, c.cache_len, c.iters)
  print(f"{c.model}: {weights / 1e6:.1f} MB of weights; bandwidth {floors['bandwidth_gb_s']} GB/s, "
        f"matmul {floors['matmul_gflop_s']} GFLOP/s; weight-read floor {floor_ms:.2f} ms/step")
  print("   B    T        ms   us/row-token   c(B,T)/c(B,1)")
  base = {r["B"]: r["ms"] for r in table if r["T"] == 1}
  for r in table:
    ratio = r["ms"] / base[r["B"]] if r["B"] in base else float("nan")
    print(f"{r['B']:4d} {r['T']:4d} {r['ms']:9.3f} {r['us_per_token']:14.2f} {ratio:15.2f}")
  print(json.dumps({"model": c.model, "weight_bytes": weights, **floors,
                    "floor_ms_b1": round(floor_ms, 3), "table": table}))


if __name__ == "__main__":
  app.run(main)
