"""A run directory's records, written in one place: `metrics.jsonl` (one record per step, also
sent to the run's loggers: TensorBoard under `tb/`, and Weights & Biases under `wandb/` when
`train.loggers` names it), `eval.jsonl` (each held-out evaluation's per-prompt accuracy) and
`rollouts.jsonl` (each step's engine dispatches). `compare.py` reads them back.

Step metrics are named by namespace (`train/`, `rollout/`, `spec/`, `drafter/`, `eval/`,
`time/`), except the keys that tools and checks read: `step`, `reward`, `step_s`, `rollout_s`
and `compile_events`.

TensorBoard files come from tensorboardX: `clu.metric_writers` (0.0.12) writes them only through
TensorFlow (its default writer imports it), which the project does not install."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os

import numpy as np

from tlt_jax.evaluation import group_stats
from tlt_jax.paths import as_path, is_remote, open_appending
from tlt_jax.rl.rundir import RUN_RECORD

METRICS, EVALS, ROLLOUTS = "metrics.jsonl", "eval.jsonl", "rollouts.jsonl"
LOGGERS = ("tensorboard", "wandb")


def check_loggers(loggers, out_dir: str) -> None:
  """A one-line error for an unknown logger, or for `wandb` without its package or with a remote
  run directory (its files are local)."""
  if isinstance(loggers, str):
    raise ValueError(f"loggers must be a tuple of names, e.g. ('tensorboard', 'wandb'), got "
                     f"{loggers!r}.")
  unknown = [name for name in loggers if name not in LOGGERS]
  if unknown:
    raise ValueError(f"loggers {unknown} unknown; choose from {', '.join(LOGGERS)}.")
  if "wandb" in loggers and importlib.util.find_spec("wandb") is None:
    raise ValueError("loggers includes 'wandb' but the wandb package is not installed; "
                     "pip install -e '.[wandb]'.")
  if "wandb" in loggers and is_remote(out_dir):
    raise ValueError(f"loggers includes 'wandb', which writes its files into the run directory, "
                     f"but {out_dir} is not local; log to tensorboard only.")


class WandbLogger:
  """A run's metrics in Weights & Biases (the optional `wandb` package, imported only here):
  files under `out_dir/wandb`, the run id fixed by the directory so that a resumed run goes on
  the same W&B run, and offline (synced later with `wandb sync`) unless `WANDB_MODE` says
  otherwise or an API key is set."""

  def __init__(self, out_dir: str, name: str):
    self._wandb = wandb = importlib.import_module("wandb")
    mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY")
                                            else "offline")
    record = as_path(out_dir) / RUN_RECORD
    config = json.loads(record.read_text()) if record.exists() else {}
    run_id = hashlib.sha256(str(as_path(out_dir)).encode()).hexdigest()[:16]
    os.makedirs(os.path.join(out_dir, "wandb"), exist_ok=True)
    self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "tlt_jax"), name=name,
                          id=run_id, resume="allow", dir=out_dir, mode=mode, config=config)

  def log(self, scalars: dict, step: int) -> None:
    """One step's numbers."""
    self.run.log(scalars, step=step)

  def close(self) -> None:
    """Finishes the run, then waits for W&B's service process to write its files out: once
    `finish` returned, a loaded machine has read the run's record file still empty."""
    self.run.finish()
    self._wandb.teardown()


class RunWriter:
  """Appends to a run directory's records (`resumed`: after the ones already there) and sends
  each step's numbers to `loggers`. Not `enabled` (every process of a run but process 0):
  writes nothing."""

  def __init__(self, out_dir: str, resumed: bool, enabled: bool = True,
               loggers: tuple[str, ...] = ("tensorboard",)):
    root = as_path(out_dir)
    start = open_appending if resumed else (lambda path: path.open("w"))
    names = (METRICS, EVALS, ROLLOUTS) if enabled else ()
    self._files = {name: start(root / name) for name in names}
    self._tb = None
    if enabled and "tensorboard" in loggers:
      # Imported here: tensorboardX imports torch where it is installed (2.3 s of a start).
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(str(root / "tb"))
    self._wandb = (WandbLogger(str(root), root.name)
                   if enabled and "wandb" in loggers else None)

  def _line(self, name: str, record: dict) -> None:
    if not self._files:
      return
    self._files[name].write(json.dumps(record) + "\n")
    self._files[name].flush()

  def step(self, metrics: dict, rollout: dict) -> None:
    """A step's metrics (numbers also to the loggers, at `metrics["step"]`) and rollout."""
    self._line(METRICS, metrics)
    self._line(ROLLOUTS, rollout)
    scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    if self._tb is not None:
      for k, v in scalars.items():
        self._tb.add_scalar(k, v, metrics["step"])
    if self._wandb is not None:
      self._wandb.log(scalars, metrics["step"])

  def evaluation(self, step: int, final: bool, per_prompt_accuracy: list[float]) -> None:
    """An evaluation's per-prompt accuracy at `step` (`final`: after the last step)."""
    self._line(EVALS, {"step": step, "final": final, "per_prompt_accuracy": per_prompt_accuracy})

  def close(self) -> None:
    """Flushes and closes the files."""
    if self._tb is not None:
      self._tb.close()
    if self._wandb is not None:
      self._wandb.close()
    for f in self._files.values():
      f.close()


def accept_len(records: list[dict]) -> float:
  """The mean accepted length of the steps among `records` that speculated (a step's
  `spec/accept_len` is its own rollout's; 0 where it decoded plainly throughout)."""
  speculated = [m["spec/accept_len"] for m in records if m.get("spec/accept_len")]
  return float(np.mean(speculated)) if speculated else 0.0


def step_metrics(step: int, first, result, learned: dict, mismatch: float,
                 drafter: dict | None, seconds: dict, counts: dict) -> dict:
  """One step's record, assembled in one place: the first rollout round's samples `first` and
  engine `result`, the update's (and the learner's selection) figures `learned`, the trainer's
  log-prob mismatch against the rollout, the adaptive drafter's figures, the stages' `seconds`
  (rollout, update, weight_sync, collective, step) and `counts` (drafter_version, sync_bytes,
  collective_bytes). Top-level keys are what tools and checks read; the rest by namespace."""
  correct = (first.rewards_PxG() >= 1.0).astype(np.float32)
  summary = result.timeline.summary()
  out = {
      "step": step, "reward": float(first.rewards_R.mean()),
      **{f"rollout/{k}": v for k, v in group_stats(correct, first.lengths_R,
                                                   first.rewards_PxG()).items()},
      "rollout/tokens_per_s": summary["tokens_per_s"],
      "rollout/replay_fraction": summary["replay_fraction"],
      "spec/accept_len": summary.get("spec", {}).get("accept_len", 0.0),
      "spec/sd_on_fraction": summary["sd_on_fraction"],
      **{f"spec/steps/{arm}": n for arm, n in summary["spec_steps_per_arm"].items()},
      "drafter/version": counts["drafter_version"],
      **{f"train/{k}": v for k, v in learned.items()},
      "train/logprob_mismatch_max": mismatch,
      "train/collective_bytes": int(counts["collective_bytes"]),
      "train/sync_bytes": int(counts["sync_bytes"]),
      **(drafter or {"time/drafter_s": 0.0, "drafter/idle_used_s": 0.0}),
      "rollout_s": round(seconds["rollout"], 4), "time/tail_s": round(tail_seconds(result), 4),
      "time/update_s": round(seconds["update"], 4),
      "time/weight_sync_s": round(seconds["weight_sync"], 4),
      "time/collective_s": round(seconds["collective"], 4),
      "time/idle_device_s": round(float(sum(summary["shard_idle_s"])), 4),
      "step_s": round(seconds["step"], 4),
  }
  out["time/rollout_share"] = round(out["rollout_s"] / out["step_s"], 4)
  if drafter:  # what the adaptive drafter's training added to the step, beyond idle shards
    out["drafter/overhead"] = round(out["time/drafter_s"] / out["step_s"], 4)
  return out


def rollout_record(step: int, res) -> dict:
  """The engine's dispatches of one rollout, compactly: the input of `rollout_anatomy.ipynb`."""
  tl = res.timeline
  events = [[e.shard, e.kind, round(e.start, 5), round(e.end, 5), e.bucket, e.live, e.live_after,
             e.tokens] for e in tl.events]
  return {"step": step, "wall_s": round(tl.wall_s, 5), "shard_idle_s": tl.summary()["shard_idle_s"],
          "events": events, "spec": tl.spec}


def tail_seconds(res, fraction: float = 0.25) -> float:
  """Decode time while the live batch is at most `fraction` of the rollout's widest batch."""
  dec = [e for e in res.timeline.events if e.kind != "prefill" and e.kind != "compact"]
  if not dec:
    return 0.0
  widest = max(e.live for e in dec)
  return float(sum(e.end - e.start for e in dec if e.live <= max(1, fraction * widest)))
