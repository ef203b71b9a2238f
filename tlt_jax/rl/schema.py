"""A run config's schema: the dataclass behind each section, which holds every default.

A config file sets only what its run changes; the command line may set any field the section's
dataclass has, whether or not the file mentions it (`experiments/launch.py` asks `field_type`,
then `parse_value`). The defaults test (`tests/rl/test_config.py`) reads `SECTIONS` to
find config values that merely repeat a default.
"""

from __future__ import annotations

import ast
import dataclasses

from tlt_jax.distributed import DistributedConfig
from tlt_jax.drafter.adaptive import AdaptiveConfig
from tlt_jax.drafter.buffer import BufferConfig
from tlt_jax.drafter.model import DrafterConfig
from tlt_jax.drafter.publish import PublishConfig
from tlt_jax.drafter.spot import SpotConfig
from tlt_jax.drafter.train import DrafterTrainConfig
from tlt_jax.drafter.warmup import WarmupConfig
from tlt_jax.models.precision import Precision
from tlt_jax.rl.learners import LEARNERS
from tlt_jax.rl.memory import PlanTarget
from tlt_jax.rl.trainer import LoopConfig
from tlt_jax.rl.update import OptimConfig
from tlt_jax.rollout.engine import EngineConfig
from tlt_jax.rollout.history import HistoryConfig
from tlt_jax.spec.strategy import SpecConfig
from tlt_jax.workloads import WORKLOADS, DrafterRecipe, WorkloadConfig

# Section path -> the dataclass whose fields it holds.
SECTIONS: dict[tuple[str, ...], type] = {
    ("model",): Precision,
    ("rollout",): WorkloadConfig,
    ("rollout", "engine"): EngineConfig,
    ("rollout", "history"): HistoryConfig,
    ("spec",): SpecConfig,
    ("drafter",): DrafterRecipe,
    ("drafter", "model"): DrafterConfig,
    ("drafter", "train"): DrafterTrainConfig,
    ("drafter", "warmup"): WarmupConfig,
    ("drafter", "adaptive"): AdaptiveConfig,
    ("drafter", "adaptive", "train"): DrafterTrainConfig,
    ("drafter", "adaptive", "buffer"): BufferConfig,
    ("drafter", "adaptive", "spot"): SpotConfig,
    ("drafter", "adaptive", "publish"): PublishConfig,
    ("rl", "optim"): OptimConfig,
    ("train",): LoopConfig,
    ("distributed",): DistributedConfig,
    ("plan",): PlanTarget,
    **{("rl", name): cls for name, cls in LEARNERS.items()},
}
# Fields a section holds beside (or instead of) its dataclass's, with their types.
EXTRA = {
    ("model",): {"name": "str", "path": "str"},
    ("rl",): {"learner": "str"},
    ("rollout",): {"noise": "str", "noise_refresh": "int"},
    ("train",): {"num_prompts": "int", "eval_prompts": "int"},
}
# Dataclass fields a section does not hold (the run's identity, or read from another section).
EXCLUDED = {
    ("rollout",): ("name", "task", "warm_start", "cache_dir", "precision"),
    ("drafter",): ("model", "train", "warmup"),
    ("drafter", "adaptive"): ("train", "buffer", "spot", "publish"),
    ("train",): ("out_dir", "seed"),
}


def fields(section: tuple[str, ...], config=None) -> dict[str, str]:
  """The settable fields of a section path and their types (as written in the dataclass); the
  `task` section's are the workload's task settings (`config.model.name`'s)."""
  if section == ("task",) and config is not None and config.get("model"):
    kind = WORKLOADS.get(config.model.get("name"))
    return {k: type(v).__name__ for k, v in (kind.task if kind else {}).items()
            if not isinstance(v, dict)}
  out = {}
  if section in SECTIONS:
    out = {f.name: f.type if isinstance(f.type, str) else f.type.__name__
           for f in dataclasses.fields(SECTIONS[section])
           if f.name not in EXCLUDED.get(section, ())}
  return out | EXTRA.get(section, {})


def defaults(section: tuple[str, ...]) -> dict:
  """The dataclass defaults of a section path's fields (those that have one)."""
  if section not in SECTIONS:
    return {}
  out = {}
  for f in dataclasses.fields(SECTIONS[section]):
    if f.name in EXCLUDED.get(section, ()):
      continue
    if f.default is not dataclasses.MISSING:
      out[f.name] = f.default
    elif f.default_factory is not dataclasses.MISSING:
      out[f.name] = f.default_factory()
  return out


def field_type(path: tuple[str, ...], config=None) -> str | None:
  """The type of the field at `path` (e.g. ("train", "mini_batches") -> "int"), None when no
  section of the schema has it."""
  return fields(tuple(path[:-1]), config).get(path[-1]) if len(path) > 1 else None


def parse_value(text: str, type_name: str):
  """A command-line value for a field of type `type_name`: Python literals (numbers, tuples,
  True/False, quoted strings), bare words as strings; raises ValueError naming the type."""
  if type_name == "bool" and text.lower() in ("true", "false"):
    return text.lower() == "true"
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    value = text
  if type_name == "str":
    return value if isinstance(value, str) else text
  if type_name == "float" and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  if isinstance(value, list):
    value = tuple(value)
  expected = {"int": int, "float": float, "bool": bool}.get(type_name)
  if expected is not None and (not isinstance(value, expected)
                               or (expected is int and isinstance(value, bool))):
    raise ValueError(f"{text!r} is not of type {type_name}")
  return value
