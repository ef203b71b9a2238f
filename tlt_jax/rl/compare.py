"""Comparing two GRPO runs (a baseline and a TLT run of the same config and seed) from their
`metrics.jsonl`: is it the same run, how much faster is it, and how much faster could it be.

`amdahl_bound` = 1 / ((1 - share) + share / rollout_speedup), where `share` is the rollout's share
of the baseline's step time: the end-to-end speedup that a rollout speedup alone can give.
`rollout_token_speedup` is the geometric mean over steps of the rollouts' tokens per second:
where the runs part (bf16 `fast` numerics) their responses differ, and their rollout times
compare different work.
"""

from __future__ import annotations

import json

import numpy as np

from tlt_jax.paths import as_path
from tlt_jax.rl.metrics import EVALS, METRICS, accept_len

COMPILE_S = "time/compile_s"  # a step's seconds of building programs, left out of its timings


def read_metrics(run_dir: str) -> list[dict]:
  """The per-step records of a run directory (the last record of each step wins, so a resumed
  run that repeated a step counts it once)."""
  path = as_path(run_dir) / METRICS
  if not path.exists():
    raise FileNotFoundError(f"No metrics.jsonl in {run_dir!r}: is it a train_grpo run directory?")
  by_step = {}
  for line in path.read_text().splitlines():
    if line.strip():
      rec = json.loads(line)
      by_step[rec["step"]] = rec
  if not by_step:
    raise ValueError(f"{path} holds no steps yet.")
  return [by_step[s] for s in sorted(by_step)]


def heldout_change(run_dir: str) -> dict:
  """Held-out accuracy before the run's first step and after its last, from `eval.jsonl` (same
  prompts, same evaluation key), with the standard error of the change: the standard deviation
  over prompts of each prompt's change, over sqrt(prompts). `heldout_gain_se` = change / SE."""
  path = as_path(run_dir) / EVALS
  if not path.exists():
    raise FileNotFoundError(f"No eval.jsonl in {run_dir!r}: the run needs eval_every > 0.")
  records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  first = min((r for r in records if not r["final"]), key=lambda r: r["step"], default=None)
  last = next((r for r in reversed(records) if r["final"]), None)
  if first is None or last is None or first["step"] != 0:
    raise ValueError(f"{path} needs an evaluation at step 0 and a final one.")
  before, after = (np.asarray(r["per_prompt_accuracy"]) for r in (first, last))
  change = after - before
  se = float(change.std(ddof=1) / np.sqrt(len(change))) if len(change) > 1 else 0.0
  gain = float(change.mean())
  return {"heldout_before": float(before.mean()), "heldout_after": float(after.mean()),
          "heldout_gain": round(gain, 6), "heldout_se": round(se, 6),
          "heldout_gain_se": round(gain / se, 3) if se > 0 else 0.0,
          "heldout_prompts": int(len(change))}


def amdahl_bound(share: float, rollout_speedup: float) -> float:
  """The end-to-end speedup a rollout speedup allows when the rollout is `share` of a step."""
  return 1.0 / ((1.0 - share) + share / rollout_speedup)


def compare_runs(baseline_dir: str, tlt_dir: str, skip_first: int = 1) -> dict:
  """Figures of `tlt_dir` against `baseline_dir` over the steps both ran.

  Rewards are compared on every common step. Times leave out the first `skip_first` steps (first
  executions) and every step's compilation seconds (executables compiled on first use), which are
  reported apart as `compile_s_baseline` / `compile_s_tlt`: a long run compiles once.
  """
  base = {m["step"]: m for m in read_metrics(baseline_dir)}
  tlt = {m["step"]: m for m in read_metrics(tlt_dir)}
  steps = sorted(set(base) & set(tlt))
  if not steps:
    raise ValueError(f"{baseline_dir!r} and {tlt_dir!r} have no step in common.")
  diffs = [abs(base[s]["reward"] - tlt[s]["reward"]) for s in steps]
  timed = steps[skip_first:] if len(steps) > skip_first else steps
  total = lambda run, k: float(sum(run[s][k] - run[s].get(COMPILE_S, 0.0) for s in timed))
  share = total(base, "rollout_s") / total(base, "step_s")
  rollout_speedup = total(base, "rollout_s") / total(tlt, "rollout_s")
  bound = amdahl_bound(share, rollout_speedup)
  rate = "rollout/tokens_per_s"
  ratios = [tlt[s][rate] / base[s][rate] for s in timed if base[s].get(rate) and tlt[s].get(rate)]
  e2e = total(base, "step_s") / total(tlt, "step_s")
  return {
      "steps": len(steps), "timed_steps": len(timed),
      "reward_max_abs_diff": float(max(diffs)),
      "rewards_identical": bool(max(diffs) == 0.0),
      "e2e_speedup": round(e2e, 4), "rollout_speedup": round(rollout_speedup, 4),
      "rollout_share": round(share, 4), "amdahl_bound": round(bound, 4),
      "e2e_over_amdahl": round(e2e / bound, 4),
      **({"rollout_token_speedup": round(float(np.exp(np.mean(np.log(ratios)))), 4)}
         if ratios else {}),
      "compile_events_baseline": int(sum(base[s].get("compile_events", 0) for s in steps)),
      "compile_events_tlt": int(sum(tlt[s].get("compile_events", 0) for s in steps)),
      "compile_s_baseline": round(sum(base[s].get(COMPILE_S, 0.0) for s in steps), 3),
      "compile_s_tlt": round(sum(tlt[s].get(COMPILE_S, 0.0) for s in steps), 3),
      "accept_len": round(accept_len([tlt[s] for s in timed]), 4),
      "reward_baseline_last": base[steps[-1]]["reward"],
      "reward_tlt_last": tlt[steps[-1]]["reward"],
  }
