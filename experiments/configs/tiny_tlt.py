"""The same GRPO run as tiny_baseline, with speculative decoding in the rollout (`coupled` rule:
the same run, token for token) and the warmed-up EAGLE drafter, which keeps adapting to the
policy (spot training from captured hidden states, checked publishing) on rollout shards that
finish early (`engine.num_shards` > 1; on CPU with fake devices). With one device there is no idle
window: set `adaptive.spot.budget_s` > 0 to train that many seconds per RL step between the
rollout and the update, at that cost in wall time. The final policy and drafter are exported to
`out_dir/export`.

Run:
  python -m experiments.train_grpo --config=experiments/configs/tiny_tlt.py
Small CPU variant (tests):
  python -m experiments.train_grpo --config=experiments/configs/tiny_tlt.py:small
"""

import ml_collections

from experiments.configs import tiny_baseline


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  c = tiny_baseline.get_config(variant)
  c.name = "tiny_tlt" if variant != "long" else "tiny_tlt_long"
  c.out_dir = f"runs/{c.name}"
  c.spec = ml_collections.ConfigDict(dict(
      threshold=8 if variant != "small" else 16, rule="coupled", epsilon=0.1, window=300,
      min_accept_len=1.05, health_window=64, seed=0,
      arms=(("eagle", 3, 0), ("eagle", 6, 0), ("suffix", 4, 3), ("plain", 1, 0))))
  c.adaptive = ml_collections.ConfigDict(dict(
      train=dict(lr=1e-3, warmup_steps=5, weight_decay=1e-2, clip=1.0),
      buffer=dict(max_tokens=200_000, length_power=1.0, half_life=4.0, min_length=2),
      spot=dict(batch_rows=16, seq_len=128, budget_s=0.0, max_steps_per_window=0,
                min_segments=16, seed=0),
      publish=dict(depth=4, min_ratio=0.8, seq_len=128),
      holdout_rows=16))
  c.export = True
  if variant == "small":
    c.adaptive.spot.budget_s, c.adaptive.spot.min_segments = 0.5, 4
  return c
