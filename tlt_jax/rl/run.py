"""An RL run from an ml-collections config (what `experiments.train_grpo` launches, and the demo
twice): the workload, the learner (GRPO unless `config.learner` names another), the optional
speculative decoding and drafter, held-out evaluation, the trainer; returns the run's summary."""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import numpy as np

from tlt_jax import sft
from tlt_jax.drafter.adaptive import AdaptiveConfig
from tlt_jax.errors import ConfigError
from tlt_jax.hashing import provenance
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rl.compare import compare_runs, heldout_change, read_metrics
from tlt_jax.rl.learner import learner_from_config
from tlt_jax.rl.trainer import LoopConfig, Trainer
from tlt_jax.rl.update import OptimConfig
from tlt_jax.rollout.engine import EngineConfig
from tlt_jax.spec.strategy import spec_config_from_dict
from tlt_jax.workloads import (build_drafter, build_workload, get_workload, reward_name,
                               starting_policy)


def check_config(c) -> None:
  """Checks every setting of a run config that needs nothing loaded, before any work: a bad
  value raises `ConfigError` naming its key (the launchers print it as one line)."""

  def check(key: str, build):
    try:
      return build()
    except (ValueError, TypeError) as e:
      raise ConfigError(f"config.{key}: {e}" if key else f"config: {e}") from None

  check("model", lambda: get_workload(c.model))
  check("reward", lambda: reward_name(c))
  check("", lambda: SamplingParams(temperature=c.temperature, top_k=c.get("top_k", 0),
                                   top_p=c.get("top_p", 1.0),
                                   max_new_tokens=c.get("max_new_tokens") or 1))
  for key in ("steps", "num_prompts", "prompts_per_step", "group_size", "micro_batches"):
    if not isinstance(c[key], int) or c[key] < 1:
      raise ConfigError(f"config.{key} must be an integer >= 1, got {c[key]!r}.")
  if c.prompts_per_step > c.num_prompts:
    raise ConfigError(f"config.prompts_per_step={c.prompts_per_step} exceeds config.num_prompts="
                      f"{c.num_prompts} (the prompt pool); lower one or raise the other.")
  mesh = tuple(c.get("mesh", (1, 1)))
  if len(mesh) != 2 or any(not isinstance(m, int) or m < 1 for m in mesh):
    raise ConfigError(f"config.mesh must be (data, fsdp) with integers >= 1, got {mesh}.")
  check("engine", lambda: EngineConfig.from_dict(dict(c.engine)))
  spec = check("spec", lambda: spec_config_from_dict(c.spec)) if c.spec else None
  check("learner", lambda: learner_from_config(c))
  check("optim", lambda: OptimConfig(**c.optim))
  if c.get("adaptive"):
    check("adaptive", lambda: AdaptiveConfig.from_dict(c.adaptive))
    if spec is None or not any(a.uses_drafter for a in spec.arms):
      raise ConfigError("config.adaptive needs an EAGLE drafter: add an ('eagle', depth, 0) arm "
                        "to config.spec.arms, or set config.adaptive = {}.")
  if c.model == "tiny":
    check("sft", lambda: sft.validate(c.sft))


@dataclasses.dataclass
class Stages:
  """What a run needs before its trainer: the starting policy (model, tokenizer) and the warm-up
  drafter (None when no arm drafts with one)."""

  policy: tuple
  drafter: object | None


def run_stages(c, progress: bool = True) -> Stages:
  """A run's cached stages, run in order before its trainer is built, each reported in one
  `[run]` line: the starting policy (`tiny`: the SFT warm start) and the warm-up drafter when an
  arm drafts with one. Each is shipped, cached or trained and cached, so a second run loads them.
  (The trainer's own warm-up, which builds every program a step runs, starts its `run`.)"""
  t0 = time.perf_counter()
  model, tok, summary = starting_policy(c, progress)
  if progress:
    print(f"[run] starting policy {provenance(summary)}: {summary.get('cache', '')} "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)
  drafter = None
  if c.spec and any(a.uses_drafter for a in spec_config_from_dict(c.spec).arms):
    t0 = time.perf_counter()
    drafter, meta = build_drafter(c, progress, policy=(model, tok))
    if progress:
      print(f"[run] warm-up drafter {provenance(meta)}: {meta.get('cache', '')} "
            f"({time.perf_counter() - t0:.1f} s)", flush=True)
  return Stages((model, tok), drafter)


def engine_config(c) -> EngineConfig:
  """The run's engine settings. Without a `compile_cache_dir`, warm-ups of later runs (and a
  re-run demo) still load their programs instead of compiling: the engine caches them in JAX's
  cache directory where one is set (by the environment, or by an earlier run in this process),
  else under the run's cache directory."""
  engine = dict(c.engine)
  if not engine.get("compile_cache_dir"):
    engine["compile_cache_dir"] = (jax.config.jax_compilation_cache_dir or os.path.join(
        c.get("cache_dir") or sft.default_cache_dir(), "jax"))
  return EngineConfig.from_dict(engine)


def build_trainer(c, progress: bool = True, stages: Stages | None = None) -> Trainer:
  """The trainer of config `c` (checked first) over its stages' products (`run_stages(c)` when
  not given), with its workload and evaluation. Builds nothing that takes long."""
  check_config(c)
  stages = stages or run_stages(c, progress)
  spec = spec_config_from_dict(c.spec) if c.spec else None
  drafter = stages.drafter
  w = build_workload(c, c.num_prompts, c.seed, c.get("train_difficulty"), policy=stages.policy)
  adaptive = AdaptiveConfig.from_dict(c.adaptive) if c.get("adaptive") else None
  eval_prompts = eval_answers = None
  if c.get("eval_every", 0):
    held_out = build_workload(c, c.eval_prompts, c.seed + 7919,  # other problems than training
                              policy=stages.policy)
    eval_prompts, eval_answers = held_out.prompts, held_out.answers
  loop = LoopConfig(out_dir=c.out_dir, steps=c.steps, prompts_per_step=c.prompts_per_step,
                    group_size=c.group_size, seed=c.seed, micro_batches=c.micro_batches,
                    mesh_shape=tuple(c.get("mesh", (1, 1))), checkpoint_every=c.checkpoint_every,
                    eval_every=c.get("eval_every", 0),
                    eval_group_size=c.get("eval_group_size", 4), export=c.get("export", False))
  return Trainer(w, loop, engine_cfg=engine_config(c), learner=learner_from_config(c),
                 optim=OptimConfig(**c.optim), spec=spec, drafter=drafter, adaptive=adaptive,
                 eval_prompts=eval_prompts, eval_answers=eval_answers)


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
      "rollout_share": float(np.mean([m["rollout_share"] for m in history])),
      "accept_len": float(np.mean([m["accept_len"] for m in history])),
      "out_dir": out_dir,
  }
  if evals:
    out["eval_accuracy_first"] = evals[0]
  if "final_eval/accuracy" in history[-1]:
    out["eval_accuracy_final"] = history[-1]["final_eval/accuracy"]
  return out


def run_from_config(c, progress: bool = True) -> dict:
  trainer = build_trainer(c, progress)
  return dict(summarize(c.name, c.out_dir, trainer.run(progress=progress)),
              **trainer.warmup_report)


def run_pair(baseline_cfg, tlt_cfg, progress: bool = True) -> dict:
  """Runs (or resumes, or finds finished) a baseline run and a TLT run of its first steps (the
  same schedule; under the `coupled` rule the same run) and compares them: held-out accuracy
  before/after the baseline's steps with the standard error of the paired change, accepted
  length, speedups, the Amdahl bound, and the warm-ups' seconds (`compile_s`, their sum)."""
  warmup_s = {}
  for name, c in (("baseline", baseline_cfg), ("tlt", tlt_cfg)):
    print(f"[run] {c.name}: {c.steps} GRPO steps -> {c.out_dir}", flush=True)
    warmup_s[name] = run_from_config(c, progress).get("warmup_s", 0.0)
  out = compare_runs(baseline_cfg.out_dir, tlt_cfg.out_dir)
  out.update(heldout_change(baseline_cfg.out_dir))
  out["baseline_steps"], out["tlt_steps"] = baseline_cfg.steps, tlt_cfg.steps
  out["warmup_s_baseline"], out["warmup_s_tlt"] = warmup_s["baseline"], warmup_s["tlt"]
  out["compile_s"] = round(warmup_s["baseline"] + warmup_s["tlt"], 3)
  out["compile_events_in_steps"] = int(sum(  # every program built after the warm-ups: 0
      m.get("compile_events", 0) for c in (baseline_cfg, tlt_cfg) for m in read_metrics(c.out_dir)))
  out["baseline_dir"], out["tlt_dir"] = baseline_cfg.out_dir, tlt_cfg.out_dir
  return out
