"""Run by test_grpo with 2 fake CPU devices: one GRPO update on (1, 1), (1, 2) and (2, 1) meshes."""

import json

import jax
import numpy as np

from tests.rl.test_grpo import _updated


def main():
  ref, _ = _updated(2, (1, 1))
  fsdp, _ = _updated(2, (1, 2))
  data, _ = _updated(2, (2, 1))
  diff = lambda a, b: max(float(np.abs(np.asarray(x) - np.asarray(y)).max())
                          for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)))
  sharded = any(len(x.sharding.device_set) == 2 and not x.sharding.is_fully_replicated
                for x in jax.tree.leaves(fsdp.params))
  print(json.dumps({"max_diff_fsdp": diff(ref, fsdp), "max_diff_data": diff(ref, data),
                    "sharded": sharded}))


if __name__ == "__main__":
  main()
