"""Replay's benchmark (`experiments/bench_replay.py`): RL runs of one config that differ only in
how the rollout's noise is addressed and whether stored responses are replayed, each in its own
run directory; what their responses kept from one visit of a prompt to the next; the chunk
verify's cost against a decode step."""

from __future__ import annotations

import copy
import os
import shutil

import numpy as np

from experiments.benchmarks.cost import cost_table
from tlt_jax.rl.config import run_config
from tlt_jax.rl.run import build_trainer
from tlt_jax.rollout.history import StoredResponses

# Steps since a prompt's last visit, grouped: (lowest, highest) of each group.
GAPS = ((1, 1), (2, 2), (3, 3), (4, 4), (5, 8), (9, 10**9))


def common_prefix(a, b) -> int:
  """How many leading tokens `a` and `b` share."""
  n = min(len(a), len(b))
  differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
  return int(differ[0]) if len(differ) else n


def _recorder(trainer) -> list:
  """Rows `(steps since the sample's last visit, tokens shared with its stored response, its
  length)` of every sample with a stored response under the same noise, appended as the run's
  rounds store theirs."""
  memory, last, rows = trainer.memory, {}, []
  record = memory.record

  def recording(addresses, responses):
    for address, new, old in zip(addresses, responses, memory.history.lookup(addresses)):
      key = StoredResponses.sample_key(address)
      if old is not None:
        rows.append((trainer.step - last[key], common_prefix(old, new), len(new)))
      last[key] = trainer.step
    record(addresses, responses)
  memory.record = recording
  return rows


def run(c, out_dir: str, name: str, seed: int, noise: str, refresh: int = 0,
        replay: bool = True) -> dict:
  """One fresh run of config `c` with these noise settings: its step records and, for a run that
  stores responses, the rows of `_recorder`."""
  c = copy.deepcopy(c)
  c.name, c.out_dir, c.seed = name, os.path.join(out_dir, name), seed
  c.rollout.noise, c.rollout.noise_refresh = noise, refresh
  if noise == "step" or not replay:  # no store: nothing to replay
    c.rollout.history.update(dict(max_tokens=0, chunk=0))
  shutil.rmtree(c.out_dir, ignore_errors=True)
  trainer = build_trainer(run_config(c, other_keys=("bench",)), progress=False)
  memory = trainer.memory
  rows = _recorder(trainer) if memory is not None and memory.history is not None else []
  history = trainer.run(progress=False)
  return {"records": history, "rows": rows, "model": trainer.w.model, "params": trainer.w.params,
          "cache_len": trainer.engine.programs.layout(trainer.w.params.max_new_tokens,
                                                      False).cache_len}


def kept_by_gap(rows) -> list[dict]:
  """Per group of `GAPS`: samples, and the share of their tokens their stored responses held
  (the leading tokens replay can take without a new decode step)."""
  out = []
  for lo, hi in GAPS:
    sel = [(p, n) for g, p, n in rows if lo <= g <= hi]
    if sel:
      shared, total = (sum(x) for x in zip(*sel))
      out.append({"gap": f"{lo}" if lo == hi else f"{lo}-{hi}" if hi < 10**9 else f">={lo}",
                  "samples": len(sel), "kept": round(shared / max(total, 1), 4)})
  return out


def chunk_cost(model, batches, chunk: int, cache_len: int, iters: int, params) -> list[dict]:
  """c(B, 1 + chunk) against c(B, 1) at each batch, each step sampling its positions under
  `params` as the engine's do: what one replay step costs in decode steps, which bounds replay's
  speedup (a replay step emits at most 1 + chunk tokens)."""
  table = {(r["B"], r["T"]): r["ms"]
           for r in cost_table(model, batches, (1, 1 + chunk), cache_len, iters, params=params)}
  return [{"B": b, "c1_ms": table[b, 1], "verify_ms": table[b, 1 + chunk],
           "verify_steps": round(table[b, 1 + chunk] / table[b, 1], 3),
           "ceiling": round((1 + chunk) * table[b, 1] / table[b, 1 + chunk], 3)}
          for b in batches]


def mean_se(values) -> tuple[float, float]:
  """The mean and its standard error (0 for one value)."""
  v = np.asarray(values, float)
  se = float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0
  return float(v.mean()), se
