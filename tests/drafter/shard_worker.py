"""Run by test_adaptive with 2 fake CPU devices: a GRPO run whose rollout has 2 shards, with the
adaptive drafter (spot training on idle shards, checked publishing) and with it frozen."""

import json
import tempfile

import jax
import numpy as np

from tests.drafter.test_drafter import EAGLE, _trained_drafter
from tests.rl.test_trainer import workload
from tlt_jax.drafter.adaptive import AdaptiveConfig
from tlt_jax.drafter.buffer import BufferConfig
from tlt_jax.drafter.publish import PublishConfig
from tlt_jax.drafter.spot import SpotConfig
from tlt_jax.drafter.train import DrafterTrainConfig
from tlt_jax.rl.grpo import GRPOConfig
from tlt_jax.rl.trainer import LoopConfig, Trainer
from tlt_jax.rl.update import OptimConfig
from tlt_jax.rollout.engine import EngineConfig
from tlt_jax.spec.strategy import SpecConfig


def run(adaptive):
  w = workload()
  drafter = _trained_drafter(w.model, steps=20)[0]
  tr = Trainer(w, LoopConfig(tempfile.mkdtemp(), steps=3, prompts_per_step=4, group_size=4),
               # One batch bucket and one arm: the fewest programs (idle windows and publishing
               # do not depend on compaction or on the arms).
               engine_cfg=EngineConfig(precompile=False, prefill_buckets=(16,), num_shards=2,
                                       batch_buckets=(8,), max_batch=8),
               learner=GRPOConfig(), optim=OptimConfig(lr=1e-2, warmup_steps=0, total_steps=10),
               spec=SpecConfig(threshold=8, rule="coupled", arms=EAGLE[:1], min_accept_len=0.0),
               drafter=drafter, adaptive=adaptive)
  windows = []  # per rollout: device id -> absolute time its shard went idle
  generate = tr.engine.generate

  def recording_generate(*a, **kw):
    res = generate(*a, **kw)
    tl = res.timeline
    windows.append({d.id: tl.t0 + end for d, end in zip(tr.engine.devices, tl.shard_end)})
    return res
  tr.engine.generate = recording_generate
  hist = tr.run(progress=False)
  return tr, hist, windows


def main():
  cfg = AdaptiveConfig(train=DrafterTrainConfig(lr=1e-3, warmup_steps=2),
                       buffer=BufferConfig(max_tokens=20_000),
                       spot=SpotConfig(batch_rows=8, seq_len=16, min_segments=4),
                       publish=PublishConfig(depth=3, min_ratio=0.5, seq_len=16))
  tr, hist, windows = run(cfg)
  _, frozen, _ = run(None)
  spot = tr.adaptive.spot
  violations = []
  for rec in spot.log:  # each step must start inside some rollout's idle window of its device
    if not any(w[rec.device] <= rec.start for w in windows):
      violations.append(rec.device)
  d0, d1 = (jax.tree.leaves(tr.engine.weights.shard(s)[1]) for s in (0, 1))
  print(json.dumps({
      "spot_steps": len(spot.log), "violations": violations,
      "published": tr.adaptive.publisher.version,
      "shards_identical": all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(d0, d1)),
      "rewards_equal_to_frozen": [m["reward"] for m in hist] == [m["reward"] for m in frozen],
      "idle_used_s": [m["drafter/idle_used_s"] for m in hist],
  }))


if __name__ == "__main__":
  main()
