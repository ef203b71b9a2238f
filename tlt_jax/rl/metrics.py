"""A run directory's records, written in one place: `metrics.jsonl` (one record per step, also
sent to TensorBoard under `tb/`), `eval.jsonl` (each held-out evaluation's per-prompt accuracy)
and `rollouts.jsonl` (each step's engine dispatches). `compare.py` reads them back.

TensorBoard files come from tensorboardX: `clu.metric_writers` (0.0.12) writes them only through
TensorFlow (its default writer imports it), which the project does not install."""

from __future__ import annotations

import json
import os

from tensorboardX import SummaryWriter

METRICS, EVALS, ROLLOUTS = "metrics.jsonl", "eval.jsonl", "rollouts.jsonl"


class RunWriter:
  """Appends to a run directory's records (`resumed`: after the ones already there). Not
  `enabled` (every process of a run but process 0): writes nothing."""

  def __init__(self, out_dir: str, resumed: bool, enabled: bool = True):
    mode = "a" if resumed else "w"
    self._files = {name: open(os.path.join(out_dir, name), mode)
                   for name in (METRICS, EVALS, ROLLOUTS)} if enabled else {}
    self._tb = SummaryWriter(os.path.join(out_dir, "tb")) if enabled else None

  def _line(self, name: str, record: dict) -> None:
    if not self._files:
      return
    self._files[name].write(json.dumps(record) + "\n")
    self._files[name].flush()

  def step(self, metrics: dict, rollout: dict) -> None:
    """A step's metrics (numbers also as TensorBoard scalars at `metrics["step"]`) and rollout."""
    self._line(METRICS, metrics)
    self._line(ROLLOUTS, rollout)
    for k, v in metrics.items() if self._tb is not None else ():
      if isinstance(v, (int, float)):
        self._tb.add_scalar(k, v, metrics["step"])

  def evaluation(self, step: int, final: bool, per_prompt_accuracy: list[float]) -> None:
    """An evaluation's per-prompt accuracy at `step` (`final`: after the last step)."""
    self._line(EVALS, {"step": step, "final": final, "per_prompt_accuracy": per_prompt_accuracy})

  def close(self) -> None:
    """Flushes and closes the files."""
    if self._tb is not None:
      self._tb.close()
    for f in self._files.values():
      f.close()


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
