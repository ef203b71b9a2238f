"""Run by test_adaptive with 2 fake CPU devices: two idle windows open together each train a
replica from the drafter's state when they opened, and `preempt` merges them into exactly the
mean of what each trained."""

import json
import time

import jax
import numpy as np

from tests.conftest import small_config
from tlt_jax.drafter.buffer import BufferConfig, DataBuffer
from tlt_jax.drafter.model import DrafterConfig, init_drafter
from tlt_jax.drafter.spot import SpotConfig, SpotTrainer
from tlt_jax.drafter.train import DrafterTrainConfig, DrafterTrainer
from tlt_jax.models import init_model


def spot_trainer(target, buf) -> SpotTrainer:
  trainer = DrafterTrainer(init_drafter(target.cfg, DrafterConfig(), seed=5), target,
                           DrafterTrainConfig(lr=3e-3, warmup_steps=2))
  cfg = SpotConfig(batch_rows=8, seq_len=16, min_segments=4, max_steps_per_window=3)
  return SpotTrainer(trainer, buf, cfg, 0)


def replica(spot: SpotTrainer, index: int, steps: int, device):
  """What window `index` trains in `steps` steps, replayed by hand on `device`."""
  t, put = spot.trainer, lambda x: jax.device_put(x, device)
  params, opt_state = put(t.params), put(t.opt_state)
  for k in range(steps):
    toks, hidden, mask = (put(x) for x in spot.batch(t.step_count + k, index))
    params, opt_state, _ = t.update_fn(params, opt_state, put(t.target_params), toks, hidden,
                                       hidden, mask)
  return params, opt_state


def main():
  devices = jax.devices()
  target = init_model(small_config(), seed=0)
  rng = np.random.default_rng(0)
  buf = DataBuffer(BufferConfig(max_tokens=10_000), target.cfg.d_model)
  for i in range(12):
    n = int(rng.integers(6, 20))
    buf.add(rng.integers(3, 53, n).astype(np.int32),
            rng.normal(size=(n, target.cfg.d_model)).astype(np.float32), 0, 0)
  spot = spot_trainer(target, buf)
  refs = [replica(spot, i, 3, devices[i]) for i in range(2)]  # from the state before training
  assert spot.start(devices[0]) and spot.start(devices[1]) and not spot.start(devices[1])
  while len(spot.log) < 6:  # each window stops itself after 3 steps
    time.sleep(0.01)
  spot.preempt()
  mean = lambda a, b: ((np.asarray(a, np.float64) + np.asarray(b)) / 2).astype(np.asarray(a).dtype)
  merged_ok = all(np.array_equal(np.asarray(m), mean(a, b)) for m, a, b in zip(
      jax.tree.leaves(spot.trainer.params), *(jax.tree.leaves(r[0]) for r in refs)))
  print(json.dumps({
      "steps_per_device": [sum(r.device == d.id for r in spot.log) for d in devices],
      "step_count": spot.trainer.step_count, "running": spot.running, "merged_exact": merged_ok,
      "replicas_differ": not all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(
          jax.tree.leaves(refs[0][0]), jax.tree.leaves(refs[1][0])))}))


if __name__ == "__main__":
  main()
