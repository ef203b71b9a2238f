"""An RL run from its typed config (`rl.config.run_config`; what `experiments.train_grpo` launches,
and the demo twice): its cached stages (starting policy, warm-up drafter), the workload, the
learner, the optional speculative decoding and adaptive drafter, held-out evaluation, the trainer;
returns the run's summary."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time

import jax
import numpy as np

from tlt_jax import distributed
from tlt_jax.drafter.costs import cost_table_for
from tlt_jax.hashing import content_digest, provenance
from tlt_jax.kernels.attention import resolve_impl
from tlt_jax.rl.compare import compare_runs, heldout_change, read_metrics
from tlt_jax.errors import ConfigError
from tlt_jax.models.config import PRESETS, SHAPES, ModelConfig, get_shape
from tlt_jax.models.pretrained import config_from_hf
from tlt_jax.rl.config import RunConfig
from tlt_jax.rl.metrics import accept_len
from tlt_jax.rl.memory import (GB, MemoryPlan, PlanTarget, device_limit_bytes, plan_memory,
                               sized_engine)
from tlt_jax.rl import rundir
from tlt_jax.rl.trainer import Trainer, check_split
from tlt_jax.rollout.engine import EngineConfig, cache_slack
from tlt_jax.rollout.programs import bucket_for, cache_length
from tlt_jax.sft import default_cache_dir
from tlt_jax.workloads import build_drafter, build_workload, fitting, starting_policy


@dataclasses.dataclass
class Stages:
  """What a run needs before its trainer: the starting policy (model, tokenizer) and the warm-up
  drafter (None when no arm drafts with one)."""

  policy: tuple
  drafter: object | None


def run_stages(rc: RunConfig, progress: bool = True) -> Stages:
  """A run's cached stages, run in order before its trainer is built, each reported in one
  `[run]` line: the starting policy (`tiny`: the SFT warm start) and the warm-up drafter when an
  arm drafts with one. Each is shipped, cached or trained and cached, so a second run loads them.
  (The trainer's own warm-up, which builds every program a step runs, starts its `run`.)
  With several processes, process 0 builds them first and the others then load them; a step's
  prompts that do not split over the processes stop every process first."""
  check_split("loop.prompts_per_step", rc.loop.prompts_per_step)
  if not distributed.is_writer():
    distributed.barrier("stages")
  stages = _stages(rc, progress and distributed.is_writer())
  if distributed.is_writer():
    distributed.barrier("stages")
  return stages


def _stages(rc: RunConfig, progress: bool) -> Stages:
  t0 = time.perf_counter()
  model, tok, summary = starting_policy(rc.workload, progress)
  if progress:
    print(f"[run] starting policy {provenance(summary)}: {summary.get('cache', '')} "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)
  drafter = None
  if rc.drafter is not None:
    t0 = time.perf_counter()
    drafter, meta = build_drafter(rc.workload, rc.drafter, rc.seed, progress,
                                  policy=(model, tok))
    if progress:
      print(f"[run] warm-up drafter {provenance(meta)}: {meta.get('cache', '')} "
            f"({time.perf_counter() - t0:.1f} s)", flush=True)
      for note in meta.get("notes", ()):  # what importing an EAGLE-1 folder left out
        print(f"[run] drafter note: {note}.", flush=True)
  return Stages((model, tok), drafter)


# A workload's model without its weights, where its `model.name` fixes it.
_WORKLOAD_SHAPES = {"tiny": PRESETS["tiny"], "smollm2": get_shape("smollm2_135m")}


def planned_shape(rc: RunConfig) -> tuple[ModelConfig, str]:
  """The architecture a plan is made for, without loading weights, and where it came from: the
  `config.json` of `model.path`'s folder (the model the run trains), else `plan.shape` (a
  recipe's model), else the workload's own model."""
  path = os.path.join(rc.workload.path, "config.json")
  if rc.workload.path and os.path.isfile(path):
    with open(path) as f:
      return config_from_hf(json.load(f), rc.workload.path), f"model.path {rc.workload.path}"
  if rc.workload.path and not rc.workload.path.endswith(".gguf"):
    raise ConfigError(f"config.model.path={rc.workload.path!r}: no config.json there to plan "
                      "from; give a Hugging Face checkpoint folder.")
  if rc.plan.shape:
    return get_shape(rc.plan.shape), f"plan.shape {rc.plan.shape}"
  if rc.workload.name in _WORKLOAD_SHAPES:
    return _WORKLOAD_SHAPES[rc.workload.name], f"the {rc.workload.name} workload's model"
  raise ConfigError(f"No model shape to plan for: set config.plan.shape (one of "
                    f"{sorted(SHAPES)}) or config.model.path to a folder with a config.json.")


def plan_for(rc: RunConfig, cfg: ModelConfig, target: PlanTarget, max_new_tokens: int = 0
             ) -> MemoryPlan:
  """The memory plan of run `rc` with model `cfg` on `target` (`rl/memory.py`)."""
  new = max_new_tokens or rc.workload.max_new_tokens
  if new < 1:
    raise ConfigError("config.rollout.max_new_tokens: set it to plan the run's memory (the "
                      "task's own maximum is known only once its data loads).")
  precision = rc.workload.precision
  return plan_memory(cfg, rc.loop, rc.engine, param_dtype=precision.param_dtype,
                     compute_dtype=precision.compute_dtype,
                     prompt_len=longest_prompt(rc, cfg, new), max_new_tokens=new, target=target,
                     drafter=rc.drafter.model if rc.drafter is not None else None,
                     buffer_tokens=rc.adaptive.buffer.max_tokens if rc.adaptive else 0)


def longest_prompt(rc: RunConfig, cfg: ModelConfig, max_new_tokens: int) -> int:
  """The longest prompt a run takes, and plans its memory for: `rollout.engine.max_prompt_len`
  where set, else the largest prefill bucket, within the model's context beside the response."""
  fits = min(rc.engine.prefill_buckets[-1],
             cfg.max_seq_len - max_new_tokens - rc.engine.cache_slack)
  return min(rc.engine.max_prompt_len or fits, fits)


def engine_for(rc: RunConfig, cfg: ModelConfig, max_new_tokens: int, progress: bool = True
               ) -> EngineConfig:
  """The run's engine settings with `max_batch` sized by `rollout.engine.kv_cache_gb` where it
  is set (reported in one `[run]` line)."""
  cache_len = cache_length(rc.engine, cfg.max_seq_len, longest_prompt(rc, cfg, max_new_tokens),
                           max_new_tokens, resolve_impl(rc.engine.attention))
  engine = sized_engine(rc.engine, cfg, cache_len, rc.workload.precision.compute_dtype)
  if progress and rc.engine.kv_cache_gb and distributed.is_writer():
    print(f"[run] rollout.engine.kv_cache_gb={rc.engine.kv_cache_gb:g}: max_batch="
          f"{engine.max_batch} ({cache_len} cache slots per row)", flush=True)
  return engine


def check_fits(rc: RunConfig, cfg: ModelConfig, max_new_tokens: int) -> MemoryPlan:
  """The plan on this machine's devices, against the memory the device reports (none on CPU:
  no limit); a one-line error, before any step, where the plan exceeds it."""
  limit = device_limit_bytes(jax.local_devices()[0])
  plan = plan_for(rc, cfg, PlanTarget(processes=jax.process_count(),
                                      devices=jax.local_device_count(),
                                      device_gb=limit / GB if limit else math.inf),
                  max_new_tokens)
  if not plan.fits:
    name, most, _ = max(plan.rows, key=lambda r: r[1])
    raise ConfigError(
        f"The run needs {plan.total_bytes / GB:.1f} GB per device and the device has "
        f"{limit / GB:.1f} GB; the largest part is {name} ({most / GB:.1f} GB): lower "
        "rollout.engine.max_batch or rollout.max_new_tokens, raise train.micro_batches (or lower "
        "train.max_tokens_per_micro_batch), set "
        "train.remat, or split the model over more devices (python -m experiments.plan_memory "
        "prints the plan).")
  return plan


def plan_line(plan: MemoryPlan) -> str:
  """The plan in one `[run]` line: the total, its largest part and the device's memory."""
  name, most, _ = max(plan.rows, key=lambda r: r[1])
  of = (f"of {plan.limit_bytes / GB:.1f} GB" if math.isfinite(plan.limit_bytes)
        else "(the device reports no limit)")
  return (f"[run] memory plan: {plan.total_bytes / GB:.3g} GB per device {of}, most of it "
          f"{name} ({most / GB:.3g} GB); python -m experiments.plan_memory prints the table")


def build_trainer(rc: RunConfig, progress: bool = True, stages: Stages | None = None) -> Trainer:
  """The trainer of `rc` over its stages' products (`run_stages(rc)` when not given), with its
  workload and evaluation. Builds nothing that takes long."""
  stages = stages or run_stages(rc, progress)
  w = build_workload(rc.workload, rc.num_prompts, rc.seed, rc.workload.task["difficulty"],
                     policy=stages.policy)
  longest = longest_prompt(rc, w.model.cfg, w.params.max_new_tokens)
  w = fitting(w, longest, "training")
  engine = engine_for(rc, w.model.cfg, w.params.max_new_tokens, progress)
  plan = check_fits(rc, w.model.cfg, w.params.max_new_tokens)
  if progress and distributed.is_writer():
    print(plan_line(plan), flush=True)
  eval_prompts = eval_answers = None
  if rc.loop.eval_every:
    held_out = fitting(build_workload(rc.workload, rc.eval_prompts, rc.seed + 7919,
                                      policy=stages.policy, split="test"), longest, "held-out")
    n = len(held_out.prompts) - len(held_out.prompts) % jax.process_count()
    eval_prompts, eval_answers = held_out.prompts[:n], held_out.answers[:n]
  costs = None
  priced = rc.spec if rc.spec is not None and rc.spec.chooser == "cost" else None
  replay_chunk = rc.replay.chunk if rc.replay.history.dispatch == "cost" else 0
  if priced is not None or replay_chunk:  # measured once per machine, cached
    top = bucket_for(engine.max_batch, engine.batch_buckets)
    t0 = time.perf_counter()
    costs, loaded = cost_table_for(w.model, stages.drafter, priced,
                                   [b for b in engine.batch_buckets if b <= top],
                                   longest + w.params.max_new_tokens
                                   + cache_slack(priced, replay_chunk),
                                   rc.workload.cache_dir or default_cache_dir(),
                                   replay_chunk=replay_chunk)
    if progress and not loaded and distributed.is_writer():
      print(f"[run] cost table: {len(costs.target_s) + len(costs.draft_s)} cells measured in "
            f"{time.perf_counter() - t0:.1f} s (cached for this machine)", flush=True)
  return Trainer(w, rc.loop, engine_cfg=engine, learner=rc.learner, optim=rc.optim,
                 spec=rc.spec, drafter=stages.drafter, adaptive=rc.adaptive, costs=costs,
                 eval_prompts=eval_prompts, eval_answers=eval_answers, replay=rc.replay,
                 settings_digest=rundir.digest(rc))


def summarize(name: str, out_dir: str, history: list[dict]) -> dict:
  """The last-line JSON of a run: rewards, held-out accuracy before/after, time split."""
  if not history:
    return {"name": name, "note": "already at the final step", "out_dir": out_dir}
  rewards = [m["reward"] for m in history]
  evals = [m["eval/accuracy"] for m in history if "eval/accuracy" in m]
  out = {
      "name": name, "steps": len(history), "first_step": history[0]["step"],
      "reward_first": rewards[0], "reward_last": rewards[-1],
      "reward_last5_mean": float(np.mean(rewards[-5:])),
      "step_s_mean": float(np.mean([m["step_s"] for m in history])),
      "rollout_share": float(np.mean([m["time/rollout_share"] for m in history])),
      "accept_len": accept_len(history),
      "out_dir": out_dir,
  }
  if evals:
    out["eval_accuracy_first"] = evals[0]
  if "eval/final_accuracy" in history[-1]:
    out["eval_accuracy_final"] = history[-1]["eval/final_accuracy"]
  return out


def start(rc: RunConfig) -> int:
  """Joins the run's process group (`tlt_jax.distributed`; nothing to join for one process) and
  checks that every process was given the same config; returns the process count."""
  count = distributed.initialize(rc.distributed)
  distributed.check_same(content_digest(repr(rc)), "config")
  return count


def run(rc: RunConfig, progress: bool = True) -> dict:
  """Runs (or resumes, or finds finished) `rc`; returns its summary and its warm-up's figures.
  Its run directory takes no other run (`rl/rundir.py`), and a launch that fails before its first
  step writes nothing there."""
  start(rc)
  rundir.prepare(rc)
  trainer = build_trainer(rc, progress)
  started = lambda resumed, step: rundir.record_launch(rc, resumed, step)
  return dict(summarize(rc.name, rc.out_dir, trainer.run(progress=progress, on_start=started)),
              **trainer.warmup_report)


def run_pair(baseline: RunConfig, tlt: RunConfig, progress: bool = True) -> dict:
  """Runs (or resumes, or finds finished) a baseline run and a TLT run of its first steps (the
  same schedule; under the `coupled` rule the same run) and compares them: held-out accuracy
  before/after the baseline's steps with the standard error of the paired change, accepted
  length, speedups, the Amdahl bound, and the warm-ups' seconds (`compile_s`, their sum)."""
  warmup_s = {}
  for name, rc in (("baseline", baseline), ("tlt", tlt)):
    print(f"[run] {rc.name}: {rc.loop.steps} GRPO steps -> {rc.out_dir}", flush=True)
    warmup_s[name] = run(rc, progress).get("warmup_s", 0.0)
  out = compare_runs(baseline.out_dir, tlt.out_dir)
  out.update(heldout_change(baseline.out_dir))
  out["baseline_steps"], out["tlt_steps"] = baseline.loop.steps, tlt.loop.steps
  out["warmup_s_baseline"], out["warmup_s_tlt"] = warmup_s["baseline"], warmup_s["tlt"]
  out["compile_s"] = round(warmup_s["baseline"] + warmup_s["tlt"], 3)
  out["compile_events_in_steps"] = int(sum(  # every program built after the warm-ups: 0
      m.get("compile_events", 0) for rc in (baseline, tlt) for m in read_metrics(rc.out_dir)))
  out["baseline_dir"], out["tlt_dir"] = baseline.out_dir, tlt.out_dir
  return out
