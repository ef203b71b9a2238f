"""Replay's benchmark: GRPO on the warm-started `tiny` policy over a pool of 64 prompts, 16 per
step for 40 steps (each prompt comes back every ~4 steps), with prompt-addressed noise.

It runs, for each seed, the step-noise baseline, prompt noise with replay, and prompt noise
renewed every `bench.refresh` visits (with replay); for the first seed also prompt noise without
replay, whose rewards must equal the replay run's (the rollout speedup is the ratio of the two
runs' rollout seconds). It prints how much of a response its stored predecessor already held
against the steps since the prompt's last visit, the chunk verify's cost against c(B, 1) on this
model, and the held-out accuracy of each noise setting (mean and standard error over seeds);
last line one JSON object.

Run:
  python -m experiments.bench_replay --config=experiments/configs/bench_replay.py
Small variant (tests):
  python -m experiments.bench_replay --config=experiments/configs/bench_replay.py:small
Rollout speed alone (one seed, prompt noise with and without replay, the chunk's cost; for a GPU):
  python -m experiments.bench_replay --config=experiments/configs/bench_replay.py:speed
The same on SmolLM2-135M-Instruct (`smollm2_baseline`'s run over a pool of 16 word problems, 8 per
step for 8 steps, so each prompt comes back every ~2 steps; no held-out evaluation):
  python -m experiments.bench_replay --config=experiments/configs/bench_replay.py:smollm2
"""

import ml_collections

from experiments.configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "small", "speed", "smollm2"):
    raise ValueError(f"Unknown variant {variant!r}; use '', 'small', 'speed' or 'smollm2'.")
  small = variant == "small"
  if variant == "smollm2":
    c = base.smollm2_run("bench_replay_smollm2")
    c.train.update(dict(num_prompts=16, prompts_per_step=8, steps=8, eval_every=0))
  elif small:
    c = base.tiny_run("bench_replay", "small")
    c.train.update(dict(num_prompts=4, checkpoint_every=0))
  else:
    c = base.tiny_run("bench_replay")
    c.train.update(dict(num_prompts=64, prompts_per_step=16, steps=40, eval_every=40,
                        eval_prompts=256))
  c.out_dir = f"runs/{c.name}"
  c.rollout.noise, c.rollout.noise_refresh = "prompt", 0
  c.rollout.history = ml_collections.ConfigDict(dict(max_tokens=1_000_000, chunk=8))
  c.bench = ml_collections.ConfigDict(dict(
      seeds=(0,) if variant in ("small", "speed", "smollm2") else (0, 1, 2),
      # The noise settings run per seed: "step", "prompt", "refresh" (prompt noise renewed).
      settings=("prompt",) if variant in ("speed", "smollm2") else ("step", "prompt", "refresh"),
      refresh=2 if small else 4,  # visits per noise epoch in the refreshed setting
      cost_iters=5 if small else 20))  # timed calls per c(B, T) cell
  return c
