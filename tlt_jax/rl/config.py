"""An RL run's config: the launcher's ml-collections config, sectioned, turned once into typed
settings (`run_config`), every key and value checked before any work.

Sections (their defaults: the dataclasses of `rl/schema.py`, listed in docs/CONFIG.md;
experiments/configs/base.py holds what the shipped recipes change):
  name, out_dir, cache_dir, seed   the run's identity, directories and seed
  model     name (a registered workload) and, for `tiny`, its SFT `warm_start` recipe
  task      reward, the training pool's `difficulty` mix, and the workload's own settings
  rollout   sampling (temperature, top_k, top_p, max_new_tokens), the `engine` layout, the noise's
            addressing (`noise`, `noise_refresh`) and the `history` of responses replayed
  spec      speculative decoding (empty: off)
  drafter   the warm-up EAGLE drafter's recipe and the `adaptive` drafter (empty: no drafter)
  rl        the `learner` by name, its settings in a section so named, and `optim`
  train     the loop: steps, pool and batch sizes, micro-batches, mesh, checkpoints, evaluation
  distributed  (optional) the coordinator and process count of a run over several processes
"""

from __future__ import annotations

import dataclasses

import ml_collections

from tlt_jax.distributed import DistributedConfig
from tlt_jax.drafter.adaptive import AdaptiveConfig
from tlt_jax.errors import ConfigError
from tlt_jax.rl.learner import Learner
from tlt_jax.rl.learners import LEARNERS, learner_from_section
from tlt_jax.rl.memory import PlanTarget
from tlt_jax.rl.trainer import LoopConfig
from tlt_jax.rl.update import OptimConfig
from tlt_jax.rollout.engine import EngineConfig
from tlt_jax.rollout.history import ReplayConfig
from tlt_jax.spec.strategy import SpecConfig, spec_config_from_dict
from tlt_jax.typed import check_keys, typed
from tlt_jax.workloads import DrafterRecipe, WorkloadConfig, drafter_recipe, workload_config

ROLLOUT_KEYS = ("engine", "noise", "noise_refresh", "history")  # beside the sampling settings
SECTIONS = ("name", "out_dir", "cache_dir", "seed", "model", "task", "rollout", "spec", "drafter",
            "rl", "train", "distributed", "plan")


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """A run's typed settings. `num_prompts`: the training prompt pool; `eval_prompts`: held-out
  prompts scored every `loop.eval_every` steps; `drafter`: the warm-up drafter's recipe, when an
  arm drafts with it."""

  name: str
  seed: int
  workload: WorkloadConfig
  engine: EngineConfig
  spec: SpecConfig | None
  drafter: DrafterRecipe | None
  adaptive: AdaptiveConfig | None
  learner: Learner
  optim: OptimConfig
  loop: LoopConfig
  num_prompts: int
  eval_prompts: int
  distributed: DistributedConfig = DistributedConfig()
  replay: ReplayConfig = ReplayConfig()
  plan: PlanTarget = PlanTarget()

  @property
  def out_dir(self) -> str:
    """The run directory."""
    return self.loop.out_dir


def replay_config(rollout, spec: SpecConfig | None) -> ReplayConfig:
  """The rollout section's noise addressing and history, checked against the spec's rule."""
  try:
    replay = ReplayConfig.from_section(rollout)
  except ConfigError:
    raise
  except ValueError as e:
    raise ConfigError(f"config.rollout: {e}") from None
  try:
    replay.check_rule(spec)
  except ValueError as e:
    raise ConfigError(f"config.rollout.history.chunk: {e}") from None
  return replay


def run_config(c: ml_collections.ConfigDict, other_keys=()) -> RunConfig:
  """`c` as typed settings; raises `ConfigError` naming the first bad key or value (the
  launchers print it as one line). `other_keys`: top-level sections a launcher reads itself
  (a benchmark's `bench`, a sweep's `sweep`)."""
  for name in c:  # a setting at the top that lives in a section (the flat layout of old)
    homes = [s for s in SECTIONS if hasattr(c.get(s), "keys") and name in c[s].keys()]
    if name not in SECTIONS + tuple(other_keys) and homes:
      raise ConfigError(f"config has no key {name!r}; did you mean config.{homes[0]}.{name}? "
                        "(run settings live in sections; see tlt_jax/rl/config.py)")
  check_keys(c, "", SECTIONS + tuple(other_keys))
  wc = workload_config(c, ROLLOUT_KEYS)
  spec = spec_config_from_dict(c.spec) if c.get("spec") else None
  replay = replay_config(c.rollout, spec)
  drafter_section = check_keys(c.get("drafter"), "drafter",
                               ("model", "train", "warmup", "warmup_prompts", "init_from",
                                "adaptive"))
  uses_drafter = spec is not None and any(a.uses_drafter for a in spec.arms)
  if uses_drafter and not drafter_section:
    raise ConfigError("config.drafter: an ('eagle', ...) or ('tree', ...) arm drafts with the "
                      "warm-up drafter; give its recipe (model, train, warmup, warmup_prompts) or "
                      "config.drafter.init_from (a shipped drafter's name or a directory).")
  recipe = drafter_recipe(drafter_section, ("adaptive",)) if uses_drafter else None
  adaptive = None
  if drafter_section.get("adaptive"):
    if not uses_drafter:
      raise ConfigError("config.drafter.adaptive needs an EAGLE drafter: add an ('eagle', depth, "
                        "0) arm to config.spec.arms, or set config.drafter.adaptive = {}.")
    adaptive = AdaptiveConfig.from_dict(drafter_section["adaptive"])
  train = check_keys(c.train, "train", [f.name for f in dataclasses.fields(LoopConfig)
                                         if f.name not in ("out_dir", "seed")]
                     + ["num_prompts", "eval_prompts"])
  num_prompts, eval_prompts = train.pop("num_prompts", None), train.pop("eval_prompts", 0)
  loop = typed(LoopConfig, dict(train, out_dir=c.out_dir, seed=c.seed), "train")
  rl = check_keys(c.rl, "rl", ("learner", "optim", *LEARNERS))
  learner = learner_from_section(rl)
  optim = dict(rl.get("optim") or {})
  # 0: every optimizer step of the run (mini-batches x epochs per RL step)
  optim["total_steps"] = (optim.get("total_steps")
                          or loop.steps * loop.mini_batches * loop.update_epochs)
  optim = typed(OptimConfig, optim, "rl.optim")
  if not isinstance(num_prompts, int) or num_prompts < loop.prompts_per_step:
    raise ConfigError(f"config.train.num_prompts (the prompt pool) must be an integer >= "
                      f"config.train.prompts_per_step={loop.prompts_per_step}, got "
                      f"{num_prompts!r}.")
  if loop.eval_every and (not isinstance(eval_prompts, int) or eval_prompts < 1):
    raise ConfigError(f"config.train.eval_prompts must be >= 1 when eval_every > 0, got "
                      f"{eval_prompts!r}.")
  return RunConfig(name=c.name, seed=c.seed, workload=wc,
                   engine=EngineConfig.from_dict(c.rollout.get("engine") or {}),
                   spec=spec, drafter=recipe, adaptive=adaptive, learner=learner, optim=optim,
                   loop=loop, num_prompts=num_prompts, eval_prompts=eval_prompts,
                   distributed=DistributedConfig.from_dict(c.get("distributed")), replay=replay,
                   plan=typed(PlanTarget, c.get("plan") or {}, "plan"))
