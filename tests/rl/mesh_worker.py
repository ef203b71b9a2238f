"""Run by test_grpo with 2 fake CPU devices: one GRPO update on (1, 1, 1), (1, 2, 1), (2, 1, 1)
and (1, 1, 2) meshes (data, fsdp, tp), and on (2, 1, 1) with a token budget of 48 per device (a
group of 3 rows per device, then one padded)."""

import json

import jax
import numpy as np
from flax import nnx

from tests.rl.test_grpo import _updated


def main():
  ref, _ = _updated(2, (1, 1))
  fsdp, _ = _updated(2, (1, 2))
  data, _ = _updated(2, (2, 1))
  tp, _ = _updated(2, (1, 1, 2))
  budget, _ = _updated(1, (2, 1), max_tokens=48)
  diff = lambda a, b: max(float(np.abs(np.asarray(x) - np.asarray(y)).max())
                          for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)))
  sharded = any(len(x.sharding.device_set) == 2 and not x.sharding.is_fully_replicated
                for x in jax.tree.leaves(fsdp.params))
  # Under tp every q/k/v, o, gate/up and down kernel is split (and the moments with it).
  split = lambda up: sorted({"/".join(map(str, p[-2:])) for p, v in nnx.to_flat_state(up.params)
                             if not v.get_value().sharding.is_fully_replicated})
  print(json.dumps({"max_diff_fsdp": diff(ref, fsdp), "max_diff_data": diff(ref, data),
                    "max_diff_tp": diff(ref, tp),
                    "max_diff_budget": diff(ref, budget), "sharded": sharded, "tp_split": split(tp),
                    "tp_opt_split": sum(not x.sharding.is_fully_replicated
                                        for x in jax.tree.leaves(tp.opt_state))}))


if __name__ == "__main__":
  main()
