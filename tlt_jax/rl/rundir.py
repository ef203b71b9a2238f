"""A run directory holds one run. Its `config.json` is written once, when the run has passed its
checks and built its first step's programs: the typed settings (every section, by the names the
config files use), the package versions and the git commit. A later launch into the directory
must give the same settings except those that may change on resume (`MAY_CHANGE`), else it stops
before any work, naming the fields that differ and the two ways out: a new `out_dir`, or
`train.resume=False`, which moves the earlier run aside to `<out_dir>.<time>` and starts afresh.
Every launch that starts appends a line to `launches.jsonl` (time, commit, whether it resumed,
the settings it changed). A launch that fails before it starts writes nothing.

Checkpoints carry the digest of the settings too (`rl/resume.py`): a checkpoint never resumes a
run of other settings, whatever happened to `config.json`.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import sys
import time

from tlt_jax import distributed
from tlt_jax.errors import ConfigError
from tlt_jax.hashing import content_digest, git_commit
from tlt_jax.paths import as_path, open_appending

RUN_RECORD = "config.json"
LAUNCHES = "launches.jsonl"
_PACKAGES = ("tlt_jax", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy")
# Settings a resumed run may change (a key, or a section ending in "."): the loop's length (and
# with it the learning-rate schedule's, `rl.optim.total_steps` 0 meaning every step) and
# cadences, where its files and caches go, its loggers and exports, the process layout, the
# plan's target, the run's name.
MAY_CHANGE = ("name", "out_dir", "cache_dir", "model.warm_start.cache_dir", "train.steps",
              "rl.optim.total_steps",
              "train.eval_every", "train.eval_group_size", "train.eval_prompts",
              "train.checkpoint_every", "train.keep", "train.loggers", "train.export",
              "train.export_every", "train.resume", "rollout.engine.compile_cache_dir",
              "distributed.", "plan.")
# RunConfig's fields -> the config's keys (longest prefix first wins).
_NAMES = {"workload.name": "model.name", "workload.path": "model.path", "workload.task": "task",
          "workload.temperature": "rollout.temperature", "workload.top_k": "rollout.top_k",
          "workload.top_p": "rollout.top_p", "workload.max_new_tokens": "rollout.max_new_tokens",
          "workload.warm_start": "model.warm_start", "workload.cache_dir": "cache_dir",
          "workload.precision": "model", "engine": "rollout.engine", "adaptive":
          "drafter.adaptive", "learner.name": "rl.learner", "optim": "rl.optim",
          "loop.out_dir": "out_dir", "loop.seed": "seed", "loop": "train",
          "num_prompts": "train.num_prompts", "eval_prompts": "train.eval_prompts",
          "replay.history": "rollout.history", "replay": "rollout"}


def run_record(rc) -> dict:
  """The run's typed settings as JSON values (what `config.json` holds under `config`)."""
  config = dataclasses.asdict(rc)
  config["learner"] = {"name": rc.learner.name, **config["learner"]}
  return json.loads(json.dumps(config, default=lambda o: o.to_dict() if hasattr(o, "to_dict")
                               else str(o)))


def settings(config: dict) -> dict:
  """`config` (a `run_record`) flattened to the config files' dotted keys."""
  out = {}

  def walk(x, path):
    if isinstance(x, dict) and x:
      for k, v in x.items():
        walk(v, f"{path}.{k}" if path else str(k))
    else:
      out[_named(path, config["learner"]["name"])] = x

  walk(config, "")
  return out


def _named(path: str, learner: str) -> str:
  names = dict(_NAMES, learner=f"rl.{learner}")
  for prefix in sorted(names, key=len, reverse=True):
    if path == prefix or path.startswith(prefix + "."):
      return names[prefix] + path[len(prefix):]
  return path


def may_change(key: str) -> bool:
  """Whether a resumed run may give `key` another value."""
  return any(key == m or (m.endswith(".") and key.startswith(m)) for m in MAY_CHANGE)


def digest(rc) -> str:
  """The digest of the settings that define the run's trajectory (all but `MAY_CHANGE`)."""
  return content_digest({k: v for k, v in settings(run_record(rc)).items()
                         if not may_change(k)})


def changed(old: dict, new: dict) -> dict:
  """{key: [old value, new value]} of the settings that differ."""
  a, b = settings(old), settings(new)
  return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def prepare(rc) -> None:
  """Before any work: where `rc.out_dir` holds another run's record, stops with one line naming
  the settings that differ (or, with `train.resume=False`, moves that run aside and starts
  afresh); a folder that holds files but no run is refused. Process 0 decides for every
  process."""
  problem = ""
  if distributed.is_writer():
    try:
      _prepare(rc)
    except ConfigError as e:
      problem = str(e)
  if distributed.first(bool(problem)):
    raise ConfigError(problem or f"process 0 refused the run directory {rc.out_dir} (its "
                                 "error says why).")


def _prepare(rc) -> None:
  out = as_path(rc.out_dir)
  if not out.is_dir() or not any(out.iterdir()):
    return
  if not rc.loop.resume:
    aside = as_path(f"{rc.out_dir}.{time.strftime('%Y%m%d-%H%M%S')}")
    out.rename(aside)
    print(f"[run] train.resume=False: moved the earlier run in {rc.out_dir} to {aside}",
          flush=True)
    return
  record = out / RUN_RECORD
  if not record.exists():
    raise ConfigError(f"{rc.out_dir} holds files but no run record ({RUN_RECORD}); use a new "
                      "out_dir, or --config.train.resume=False to move them aside.")
  diff = [k for k in changed(json.loads(record.read_text())["config"], run_record(rc))
          if not may_change(k)]
  if diff:
    shown = ", ".join(diff[:6]) + (f" and {len(diff) - 6} more" if len(diff) > 6 else "")
    raise ConfigError(f"{rc.out_dir} holds a run whose settings differ in {shown}; use a new "
                      f"out_dir, or --config.train.resume=False to move that run to "
                      f"{rc.out_dir}.<time> and start afresh.")


def record_launch(rc, resumed: bool, step: int) -> None:
  """The run has started (at `step`): a fresh run writes `config.json`; every launch appends
  its line to `launches.jsonl` with the settings it changed since the record."""
  out = as_path(rc.out_dir)
  record = out / RUN_RECORD
  config = run_record(rc)
  commit, dirty = git_commit()
  if resumed and record.exists():
    diff = changed(json.loads(record.read_text())["config"], config)
  else:
    diff = {}
    versions = {"python": sys.version.split()[0]}
    for name in _PACKAGES:
      try:
        versions[name] = importlib.metadata.version(name)
      except importlib.metadata.PackageNotFoundError:
        versions[name] = None
    record.write_text(json.dumps({"config": config, "versions": versions, "git_commit": commit,
                                  "git_dirty": dirty, "settings_digest": digest(rc)}, indent=1))
  with open_appending(out / LAUNCHES) as f:
    f.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "git_commit": commit,
                        "git_dirty": dirty, "resumed": resumed, "step": step,
                        "changed": diff}) + "\n")
