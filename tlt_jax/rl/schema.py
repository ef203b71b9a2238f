"""A run config's schema: the dataclass behind each section, which holds every default.

A config file sets only what its run changes; the command line may set any field the section's
dataclass has, whether or not the file mentions it (`experiments/launch.py` asks `field_type`,
then `parse_value`). The defaults test (`tests/rl/test_config.py`) reads `SECTIONS` to
find config values that merely repeat a default.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import re

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
    ("rollout",): ("name", "path", "task", "warm_start", "cache_dir", "precision"),
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
  """The dataclass defaults of a section path's fields (those that have one); a nested section's
  are its parent's default of it where the parent gives one (`drafter.adaptive.train`)."""
  if section not in SECTIONS:
    return {}
  owner = getattr(SECTIONS.get(section[:-1]), section[-1], None)
  if dataclasses.is_dataclass(owner) and not isinstance(owner, type):
    return {k: v for k, v in dataclasses.asdict(owner).items()
            if k not in EXCLUDED.get(section, ())}
  out = {}
  for f in dataclasses.fields(SECTIONS[section]):
    if f.name in EXCLUDED.get(section, ()):
      continue
    if f.default is not dataclasses.MISSING:
      out[f.name] = f.default
    elif f.default_factory is not dataclasses.MISSING:
      out[f.name] = f.default_factory()
  return out


def meaning(cls, name: str) -> str:
  """What a dataclass field means: its comment in the class body (beside it, or the lines just
  above it; in the class or the class it inherits it from), else the sentence of the class's
  docstring that names it in backticks."""
  for owner in cls.__mro__:
    if name not in getattr(owner, "__annotations__", {}):
      continue
    lines = inspect.getsource(owner).splitlines()
    for i, line in enumerate(lines):
      if not re.match(rf"\s+{name}\s*:", line):
        continue
      indent = len(line) - len(line.lstrip())
      at = lambda column, x: x[:column].isspace() and x[column:column + 1] == "#"
      if "#" in line:  # beside it, continued on lines whose '#' stands in the same column
        column = line.index("#")
        more = itertools.takewhile(lambda x: at(column, x), lines[i + 1:])
        return " ".join(x[x.index("#") + 1:].strip() for x in [line, *more])
      above = list(itertools.takewhile(lambda x: at(indent, x), lines[i - 1::-1]))
      if above:
        return " ".join(x.strip()[1:].strip() for x in reversed(above))
  doc = " ".join((cls.__doc__ or "").split())
  return next((s for s in re.split(r"(?<=[.;])\s+(?=[A-Z`(])", doc) if f"`{name}`" in s), "")


def reference() -> str:
  """docs/CONFIG.md: every section's settable fields with their type, default and meaning,
  from the dataclasses (`python -m experiments.config_reference` writes it)."""
  out = ["# Config reference", "",
         "Every key a run config's sections take, from the dataclasses that hold each default "
         "(`tlt_jax/rl/schema.py`; generated by `python -m experiments.config_reference`, and a "
         "test fails when this page is stale). Set any of them on the command line: "
         "`--config.<section>.<key>=<value>`. A section's own description is its dataclass's "
         "docstring.", ""]
  for path, cls in SECTIONS.items():
    section = ".".join(path)
    out += [f"## `{section}`", "", _SECTION_DOC.get(section, " ".join((cls.__doc__ or
                                                                       "").split())), "",
            "| key | type | default | meaning |", "|---|---|---|---|"]
    values = defaults(path)
    for name, type_name in fields(path).items():
      default = values.get(name, "")
      shown = "(required)" if name not in values and name not in EXTRA.get(path, {}) else (
          f"`{default!r}`" if name in values else "")
      text = meaning(cls, name) if name not in EXTRA.get(path, {}) else _EXTRA_MEANING.get(
          (section, name), "")
      out.append(f"| `{name}` | {type_name} | {shown} | {text.replace('|', '/')} |")
    out.append("")
  return "\n".join(out)


# Sections whose dataclass describes more than the section holds.
_SECTION_DOC = {
    "model": "The starting policy: the workload by `name`, its `path` (`math`), the `tiny` "
             "workload's `warm_start` recipe (`experiments/configs/base.py`), and its precision.",
    "rollout": "The rollout's sampling and the noise's addressing; `rollout.engine` and "
               "`rollout.history` are its subsections.",
}
_EXTRA_MEANING = {
    ("model", "name"): "the workload (`tiny`, `smollm2`, `math`; `workloads.WORKLOADS`)",
    ("model", "path"): "a local Hugging Face folder, a .gguf file or a preset (`math`; `smollm2`: "
                       "its own GGUF elsewhere)",
    ("rl", "learner"): "the learner by name (`grpo`, `gspo`, `dapo`); its settings in `rl.<name>`",
    ("rollout", "noise"): "the noise's address: `step` (fresh every step) or `prompt` "
                          "(docs/REPLAY.md)",
    ("rollout", "noise_refresh"): "visits of a prompt per noise epoch (0: never renewed)",
    ("train", "num_prompts"): "the training prompt pool",
    ("train", "eval_prompts"): "held-out prompts scored every `eval_every` steps",
}


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
