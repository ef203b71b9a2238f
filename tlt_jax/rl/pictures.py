"""Pictures of runs from their run directories (`compare.py` reads the same records): of any
runs, `run_curves` (batch reward, held-out accuracy, response length and, where a run
speculated, accepted length by step: `python -m experiments.plot RUN [RUN ...]`); of a baseline
run and a TLT run, `reward_curves` (batch reward and held-out accuracy by step and by wall time)
and `rollout_anatomy` (the live rows over one rollout with its speculative dispatches, and the
accepted length by step). The demo saves the pair's next to its runs; the notebooks draw them
too."""

from __future__ import annotations

import json

import numpy as np
from matplotlib.figure import Figure  # no pyplot: no backend, no global state (headless CI)

from tlt_jax.paths import as_path
from tlt_jax.rl.compare import read_metrics
from tlt_jax.rl.metrics import ROLLOUTS

_RUNS = (("baseline", "o-"), ("TLT", "x--"))
_EVENT_FIELDS = ("shard", "kind", "start", "end", "bucket", "live", "live_after", "tokens")


def reward_curves(baseline_dir: str, tlt_dir: str, path: str | None = None) -> Figure:
  """Batch reward and held-out accuracy (where a run evaluated) against the RL step and against
  wall seconds (the cumulative step time), TLT over the baseline; saved to `path` when given.
  Returns the figure."""
  fig = Figure(figsize=(14, 3.8))
  axes = fig.subplots(1, 3)
  for (name, style), run_dir in zip(_RUNS, (baseline_dir, tlt_dir)):
    ms = read_metrics(run_dir)
    wall = np.cumsum([m["step_s"] for m in ms])
    axes[0].plot([m["step"] for m in ms], [m["reward"] for m in ms], style, label=name)
    axes[1].plot(wall, [m["reward"] for m in ms], style, label=name)
    evals = _heldout(ms)
    if evals:
      axes[2].plot(*zip(*evals), style, label=name)
  axes[0].set(xlabel="RL step", ylabel="batch reward", title="reward by step")
  axes[1].set(xlabel="wall seconds", ylabel="batch reward", title="reward by wall time")
  axes[2].set(xlabel="RL steps done", ylabel="held-out accuracy", title="held-out accuracy")
  for ax in axes:
    if ax.has_data():
      ax.legend()
  fig.tight_layout()
  if path:
    _save(fig, path)
  return fig


def _heldout(ms: list[dict]) -> list[tuple]:
  """(steps done, held-out accuracy) of a run's evaluations, the final one included."""
  evals = [(m["step"], m["eval/accuracy"]) for m in ms if "eval/accuracy" in m]
  if "eval/final_accuracy" in ms[-1]:
    evals.append((ms[-1]["step"] + 1, ms[-1]["eval/final_accuracy"]))
  return evals


# name -> (y label, the (x, y) points of a run's records); x is the RL step (steps done for
# held-out accuracy)
CURVES = {
    "reward": ("batch reward", lambda ms: [(m["step"], m["reward"]) for m in ms]),
    "heldout_accuracy": ("held-out accuracy", _heldout),
    "response_length": ("response length, median (tokens)",
                        lambda ms: [(m["step"], m["rollout/length_p50"]) for m in ms
                                    if "rollout/length_p50" in m]),
    "accept_len": ("accepted length (tokens per speculative step)",
                   lambda ms: [(m["step"], m["spec/accept_len"]) for m in ms
                               if m.get("spec/accept_len")]),
}


def run_labels(run_dirs: list[str]) -> list[str]:
  """Each run's name (its `config.json`), or its directory's name where names repeat or a run
  has no record."""
  names = []
  for d in run_dirs:
    record = as_path(d) / "config.json"
    name = json.loads(record.read_text())["config"].get("name") if record.exists() else None
    names.append(name or as_path(d).name)
  return [n if names.count(n) == 1 else as_path(d).name for n, d in zip(names, run_dirs)]


def run_curves(run_dirs: list[str], out_dir: str) -> list[str]:
  """One PNG per curve of `CURVES` that any of the runs has points for, each run a labelled
  line, in `out_dir`; returns the paths written."""
  runs = [(label, read_metrics(d)) for label, d in zip(run_labels(run_dirs), run_dirs)]
  as_path(out_dir).mkdir(parents=True, exist_ok=True)
  written = []
  for name, (ylabel, points) in CURVES.items():
    fig = Figure(figsize=(6, 3.8))
    ax = fig.subplots()
    for label, ms in runs:
      xy = points(ms)
      if xy:
        ax.plot(*zip(*xy), "o-" if len(xy) < 40 else "-", label=label)
    if not ax.has_data():
      continue
    ax.set(xlabel="RL steps done" if name == "heldout_accuracy" else "RL step", ylabel=ylabel,
           title=ylabel.split(" (")[0])
    ax.legend()
    fig.tight_layout()
    written.append(str(as_path(out_dir) / f"{name}.png"))
    _save(fig, written[-1])
  return written


def _save(fig: Figure, path: str) -> None:
  """`fig` as a PNG at `path` (a local or remote path, `tlt_jax/paths.py`)."""
  with as_path(path).open("wb") as f:
    fig.savefig(f, format="png", dpi=110)


def rollouts(run_dir: str) -> list[dict]:
  """A run's `rollouts.jsonl` records, each event as a dict (`_EVENT_FIELDS`)."""
  text = (as_path(run_dir) / ROLLOUTS).read_text()
  recs = [json.loads(line) for line in text.splitlines() if line.strip()]
  for r in recs:
    r["events"] = [dict(zip(_EVENT_FIELDS, e)) for e in r["events"]]
  return recs


def live_rows(decode_events: list[dict]) -> tuple[np.ndarray, np.ndarray]:
  """The live rows of all shards together over a rollout, as a step function (times, rows):
  each shard counts its latest dispatch's live rows from its start until the shard's last
  dispatch ends."""
  shards = sorted({e["shard"] for e in decode_events})
  times = np.unique([x for e in decode_events for x in (e["start"], e["end"])])
  total = np.zeros(len(times))
  for s in shards:
    evs = sorted((e for e in decode_events if e["shard"] == s), key=lambda e: e["start"])
    starts = np.array([e["start"] for e in evs])
    idx = np.searchsorted(starts, times, side="right") - 1
    rows = np.array([e["live"] for e in evs])[np.maximum(idx, 0)]
    total += np.where((idx >= 0) & (times < evs[-1]["end"]), rows, 0)
  return times, total


def rollout_anatomy(baseline_dir: str, tlt_dir: str, path: str | None = None,
                    step: int | None = None) -> Figure:
  """The live rows over one rollout (the last step both runs recorded, unless `step`) of each
  run, the TLT run's speculative dispatches marked; and the TLT run's accepted length and
  seconds of speculative decoding per step. Saved to `path` when given; returns the figure."""
  rb, rt = rollouts(baseline_dir), rollouts(tlt_dir)
  step = min(len(rb), len(rt)) - 1 if step is None else step
  fig = Figure(figsize=(14, 3.8))
  axes = fig.subplots(1, 3, gridspec_kw={"width_ratios": [2, 1, 1]})
  for (name, style), rec in zip(_RUNS, (rb[step], rt[step])):
    dec = [e for e in rec["events"] if e["kind"] not in ("prefill", "compact")]
    t, live = live_rows(dec)
    axes[0].step(t, live, style.lstrip("ox"), where="post", label=name)
    spec = [e for e in dec if e["kind"].startswith("spec")]
    if spec:
      axes[0].scatter([e["start"] for e in spec], np.interp([e["start"] for e in spec], t, live),
                      s=12, color="tab:red", label=f"{name}: SD on", zorder=3)
  axes[0].set(xlabel="seconds into the rollout", ylabel="live rows, all shards",
              title=f"live rows over the rollout of step {step}")
  axes[0].set_yscale("log", base=2)
  axes[0].legend()
  axes[1].plot([r.get("spec", {}).get("accept_len", 0.0) for r in rt], "o-")
  axes[1].set(xlabel="RL step", ylabel="tokens per verify step", title="TLT: accepted length")
  axes[2].bar(range(len(rt)), [sum(e["end"] - e["start"] for e in r["events"]
                                   if e["kind"].startswith("spec")) for r in rt])
  axes[2].set(xlabel="RL step", ylabel="seconds", title="TLT: time with SD on")
  fig.tight_layout()
  if path:
    _save(fig, path)
  return fig
