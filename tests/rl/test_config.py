"""A run config becomes typed settings once, before any work: every shipped config converts, and
a bad key or value is one `ConfigError` naming it (the nearest known key for a misspelling)."""

import importlib
import inspect
import pathlib

import ml_collections
import pytest

from experiments.config_reference import PATH
from experiments.configs import base, tiny_baseline, tiny_tlt
from experiments.launch import has_path
from tlt_jax.errors import ConfigError
from tlt_jax.models.precision import Precision
from tlt_jax.rl.config import run_config
from tlt_jax.rl.run import run_stages
from tlt_jax.rl import schema
from tlt_jax.rl.grpo import GRPOConfig

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "configs"


def test_every_run_config_and_variant_converts():
  for name, variants in RUNS.items():
    module = importlib.import_module(f"experiments.configs.{name}")
    for variant in variants:
      rc = run_config(module.get_config(variant), other_keys=("sweep", "bench"))
      assert rc.optim.total_steps >= rc.loop.steps  # 0 in a config: the run's own steps
  tlt = run_config(tiny_tlt.get_config("small"))
  assert tlt.drafter is not None and tlt.adaptive is not None and tlt.loop.export
  assert run_config(tiny_baseline.get_config()).learner == GRPOConfig(aggregation="sequence")


RUNS = {"tiny_baseline": ("", "small", "long"), "tiny_tlt": ("", "small", "long"),
        "smollm2_baseline": ("", "small"), "smollm2_tlt": ("", "small"),
        "tiny_seeds": ("", "small", "tlt_rejection"), "bench_drafter": ("", "small"),
        "bench_replay": ("", "small", "speed", "smollm2"),
        "hf_math": ("", "small", "tlt", "tlt,small"), "demo": ("baseline",)}
# What resolving a config computes rather than copies: 0 total optimizer steps is every step (and
# a drafter started from an artifact has the artifact's shape: `_typed_sections`).
RESOLVED = {("rl", "optim", "total_steps")}


def _typed_sections(rc):
  """Each schema section path's typed object in `rc` (None where the run has none)."""
  drafter, adaptive = rc.drafter, rc.adaptive
  out = {("model",): rc.workload.precision, ("rollout",): rc.workload,
         ("rollout", "engine"): rc.engine, ("rollout", "history"): rc.replay.history,
         ("spec",): rc.spec, ("drafter",): drafter, ("drafter", "adaptive"): adaptive,
         ("rl", "optim"): rc.optim, ("train",): rc.loop, ("distributed",): rc.distributed,
         ("plan",): rc.plan}
  out |= {("drafter", k): getattr(drafter, k, None) for k in ("model", "train", "warmup")}
  if drafter is not None and drafter.init_from:  # the drafter's shape is its artifact's
    out[("drafter", "model")] = None
  out |= {("drafter", "adaptive", k): getattr(adaptive, k, None)
          for k in ("train", "buffer", "spot", "publish")}
  return out | {p: rc.learner for p, cls in schema.SECTIONS.items()
                if p[0] == "rl" and type(rc.learner) is cls}


def test_a_recipe_resolves_to_the_dataclass_defaults_except_where_it_says_otherwise():
  """One source per default: in every shipped config and variant, each field of each typed
  section that the config does not set holds its dataclass's default once resolved (nothing
  between the config and the run, in base.py or the resolver, supplies another)."""
  found, checked = [], 0
  for name, variants in RUNS.items():
    module = importlib.import_module(f"experiments.configs.{name}")
    for variant in variants:
      c = module.get_config(variant)
      for path, obj in _typed_sections(run_config(c, other_keys=("sweep", "bench"))).items():
        for key, default in schema.defaults(path).items() if obj is not None else ():
          if has_path(c, (*path, key)) or (*path, key) in RESOLVED:
            continue
          checked += 1
          if getattr(obj, key) != default:
            found.append(f"{name}:{variant} config.{'.'.join(path)}.{key}={getattr(obj, key)!r}")
  assert not found and checked > 500, (found, checked)


def test_no_config_imports_another_than_the_shared_base():
  for path in CONFIGS.glob("*.py"):
    imports = [line for line in path.read_text().splitlines()
               if line.startswith("from experiments.configs import")]
    assert all(line == "from experiments.configs import base" for line in imports), path.name


@pytest.mark.parametrize("change, message", [
    (lambda c: c.update(steps=1), "config has no key 'steps'; did you mean config.train.steps?"),
    (lambda c: c.update(stepz=1),
     "config has no key 'stepz'; its keys: cache_dir, distributed, drafter,"),
    (lambda c: c.train.update(stepz=1), "config.train has no key 'stepz'; did you mean "
                                        "config.train.steps?"),
    (lambda c: c.train.update(steps=0), "config.train: steps must be an integer >= 1"),
    (lambda c: c.train.update(mesh_shape=(1, 0)),
     "config.train: mesh_shape must be (data, fsdp) or (data, fsdp, tp)"),
    (lambda c: c.train.update(mesh_shape=(-1, -1, 1)), "and at most one -1 (every device left)"),
    (lambda c: c.train.update(max_tokens_per_micro_batch=4096, micro_batches=2),
     "config.train: max_tokens_per_micro_batch must be >= 0 (0: micro_batches sets the "
     "micro-batches) and micro_batches 1 when it is set, got 4096 and 2."),
    (lambda c: c.train.update(num_prompts=2), "config.train.num_prompts (the prompt pool) must be"),
    (lambda c: c.rollout.update(temperature=-1.0), "config.rollout: temperature must be >= 0"),
    (lambda c: c.rollout.update(temprature=1.0), "did you mean config.rollout.temperature?"),
    (lambda c: c.rollout.engine.update(max_batch=999), "config.rollout.engine: max_batch=999"),
    (lambda c: c.rollout.engine.update(num_shard=2), "did you mean config.rollout.engine."
                                                     "num_shards?"),
    (lambda c: c.task.update(reward="score"), "config.task.reward='score': the tiny workload "
                                              "offers 'answer', 'progress'"),
    (lambda c: c.task.update(rewards="answer"), "did you mean config.task.reward?"),
    (lambda c: c.model.update(name="tinny"), "config.model.name='tinny' is not a workload (did "
                                             "you mean 'tiny'?)"),
    (lambda c: c.model.warm_start.train.update(lr=-1.0), "config.model.warm_start.train.lr must "
                                                         "be > 0"),
    (lambda c: c.rl.update(learner="ppo"), "config.rl.learner='ppo' is not a learner"),
    (lambda c: c.rl.grpo.update(clip_hihg=0.3), "did you mean config.rl.grpo.clip_high?"),
    (lambda c: c.rl.optim.update(lr=0.0), "config.rl.optim: lr must be > 0"),
    (lambda c: c.update(spec=base.spec((("eagel", 3, 0),))), "config.spec.arms: "),
    (lambda c: c.update(spec=base.spec((("eagle", 3, 0),))), "config.drafter: an ('eagle'"),
    (lambda c: c.drafter.update(adaptive=base.adaptive()), "config.drafter.adaptive needs an "
                                                           "EAGLE drafter"),
    (lambda c: c.model.update(compute_dtype="bf16"), "config.model: compute_dtype='bf16' is not "
                                                     "one of float32, bfloat16, float16"),
    (lambda c: c.model.update(param_dtype="bfloat16", compute_dtype="float32"),
     "config.model: param_dtype=bfloat16 is narrower than compute_dtype=float32"),
    (lambda c: c.model.update(dtype="bfloat16"), "did you mean config.model.param_dtype?"),
    (lambda c: c.rollout.engine.update(cache_dtype="int8"), "config.rollout.engine: cache_dtype "
                                                            "must be ''"),
])
def test_a_bad_key_or_value_is_one_config_error_naming_it(change, message):
  c = tiny_baseline.get_config("small")
  change(c)
  with pytest.raises(ConfigError) as e:
    run_config(c)
  assert message in str(e.value) and "\n" not in str(e.value)


def test_the_precision_policy_is_read_from_the_model_section():
  c = tiny_baseline.get_config("small")
  assert run_config(c).workload.precision == Precision()  # float32 throughout by default
  c.model.compute_dtype, c.rollout.engine.cache_dtype = "bfloat16", "bfloat16"
  rc = run_config(c)
  assert rc.workload.precision == Precision("float32", "bfloat16")
  assert rc.engine.cache_dtype == "bfloat16"
  c.model.numerics = "invariant"  # every key of the section (docs/CONFIG.md lists it)
  assert run_config(c).workload.precision == Precision("float32", "bfloat16", "invariant")
  c.model.numerics = "exact"
  with pytest.raises(ConfigError, match="numerics='exact' is not one of fast, invariant"):
    run_config(c)


def test_a_response_longer_than_the_context_allows_is_one_config_error_before_any_warm_up():
  """A response that leaves no room for a prompt stops the run when its policy has loaded (the
  context is the model's); one that leaves no room for the warm-up's prompts, before the drafter
  warm-up decodes anything (its rollouts would overflow the context)."""
  c = tiny_tlt.get_config("small")
  c.rollout.max_new_tokens = 100_000
  with pytest.raises(ConfigError, match=r"config.rollout.max_new_tokens=100000 leaves no room for "
                                        r"a prompt in the model's context of 384 tokens"):
    run_stages(run_config(c), progress=False)
  c.rollout.max_new_tokens = 380
  with pytest.raises(ConfigError, match="Every drafter warm-up prompt is longer than 4 tokens"):
    run_stages(run_config(c), progress=False)


def test_a_tlt_config_s_drafter_sections_are_checked():
  c = tiny_tlt.get_config("small")
  c.drafter.warmup.update(stepz=3)
  with pytest.raises(ConfigError, match=r"config.drafter.warmup has no key 'stepz'; did you mean "
                                        r"config.drafter.warmup.steps\?"):
    run_config(c)
  c = tiny_tlt.get_config("small")
  c.drafter.adaptive.spot.update(budget=1.0)
  with pytest.raises(ConfigError, match=r"did you mean config.drafter.adaptive.spot.budget_s\?"):
    run_config(c)


def _sections(node, path=()):
  """Every (path, section) of a config, nested sections included."""
  if isinstance(node, ml_collections.ConfigDict):
    yield path, node
    for key in node.keys():
      yield from _sections(node[key], path + (key,))


def _repeats(config) -> list[str]:
  """`config.<path>.<key>` for each value equal to its dataclass default (tlt_jax/rl/schema.py)."""
  out = []
  for path, section in _sections(config):
    home = next((s for s in schema.SECTIONS if path[len(path) - len(s):] == s), None)
    defaults = schema.defaults(home) if home else {}
    for key in section.keys():
      value = section[key]
      if key in defaults and not isinstance(value, ml_collections.ConfigDict) and (
          tuple(value) if isinstance(value, list) else value) == defaults[key]:
        out.append(".".join(("config", *path, key)) + f"={value!r}")
  return out


def test_the_shared_base_sets_no_default_again():
  """One home per default: a section the shared base builds holds only what differs from its
  dataclass (the schema), so a changed default reaches every run. (A config file may set a
  default's value to undo what its base section changed.)"""
  found = []
  for name, build in inspect.getmembers(base, inspect.isfunction):
    params = inspect.signature(build).parameters
    if name in ("warm_start",) or any(p.default is inspect.Parameter.empty for p in params.values()
                                      if p.kind is p.POSITIONAL_OR_KEYWORD):
      continue
    for small in ((False, True) if "small" in params else (False,)):
      out = build(small=small) if "small" in params else build()
      section = {"rollout": ("rollout",), "smollm2_rollout": ("rollout",),
                 "tiny_drafter": ("drafter",), "smollm2_drafter": ("drafter",),
                 "adaptive": ("drafter", "adaptive"), "rl": ("rl",), "train": ("train",),
                 "distributed": ("distributed",), "tiny_model": ("model",),
                 "smollm2_model": ("model",)}.get(name, ())
      wrapped = out
      for key in reversed(section):
        wrapped = ml_collections.ConfigDict({key: wrapped})
      found += [f"base.{name}: {r}" for r in _repeats(wrapped)]
  found += [f"base.tiny_run: {r}" for r in _repeats(base.tiny_run("x"))]
  found += [f"base.smollm2_run: {r}" for r in _repeats(base.smollm2_run("x"))]
  found += [f"base.with_tlt: {r}" for r in _repeats(base.with_tlt(base.tiny_run("x")))]
  assert not found, found
  # ...and the test sees a repeat where there is one.
  c = base.tiny_run("x")
  c.rollout.engine.tp = 1
  assert _repeats(c) == ["config.rollout.engine.tp=1"]



def test_the_config_reference_is_current_and_every_key_has_a_meaning():
  """docs/CONFIG.md is what `python -m experiments.config_reference` writes from the dataclasses
  now, and no key's meaning is left empty."""
  text = schema.reference()
  with open(PATH) as f:
    assert f.read() == text, "docs/CONFIG.md is stale: run python -m experiments.config_reference"
  rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| `")]
  assert len(rows) > 120 and not [r[0] for r in rows if not r[-1].strip(" |")]
