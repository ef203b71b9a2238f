"""Workloads by name, built from a config: `tiny` on the built-in task (warm-started policy) and
`smollm2` on the procedural word problems; `register_workload` adds one. Used by the benchmarks
and the trainer."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable

import ml_collections

from tlt_jax import sft
from tlt_jax.drafter.model import DrafterConfig
from tlt_jax.drafter.train import DrafterTrainConfig
from tlt_jax.drafter.warmup import WarmupConfig, warm_up, warmup_key
from tlt_jax.evaluation import task_lengths
from tlt_jax.models.pretrained import load_pretrained
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.models.tokenizer import CharTokenizer
from tlt_jax.tasks import arithmetic
from tlt_jax.tasks.math_answers import verify
from tlt_jax.tasks.math_data import chat_prompt
from tlt_jax.tasks.word_problems import WordProblemConfig, make_word_problems


@dataclasses.dataclass
class Workload:
  model: object
  tokenizer: object
  prompts: list[list[int]]
  answers: list      # what reward_fn scores against (tiny: the Problem; smollm2: the answer)
  params: SamplingParams
  reward_fn: object  # (response ids, answer) -> float; 1.0 exactly when the answer is correct


@dataclasses.dataclass(frozen=True)
class WorkloadKind:
  """A workload by name: the rewards it offers (the first is the default), its starting policy
  `policy(c, progress)` -> (model, tokenizer, summary) (a cached stage: `tiny`'s SFT warm start),
  and its prompts `build(c, tokenizer, num_prompts, seed, difficulty, reward)` -> (prompts,
  answers, max_new_tokens, reward_fn)."""

  rewards: tuple[str, ...]
  policy: Callable
  build: Callable


WORKLOADS: dict[str, WorkloadKind] = {}


def register_workload(name: str, kind: WorkloadKind) -> None:
  """Makes `config.model = name` build this workload."""
  WORKLOADS[name] = kind


def get_workload(name: str) -> WorkloadKind:
  if name not in WORKLOADS:
    near = difflib.get_close_matches(str(name), WORKLOADS, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise ValueError(f"config.model={name!r} is not a workload{hint}; known: "
                     f"{', '.join(sorted(WORKLOADS))}.")
  return WORKLOADS[name]


def reward_name(c: ml_collections.ConfigDict) -> str:
  """`c.reward`, checked against what `c.model`'s workload offers (default: its first)."""
  kind = get_workload(c.model)
  name = c.get("reward", kind.rewards[0])
  if name not in kind.rewards:
    raise ValueError(f"config.reward={name!r}: the {c.model} workload offers "
                     f"{', '.join(map(repr, kind.rewards))}.")
  return name


def _tiny_policy(c, progress: bool):
  model, summary = sft.warm_start(c.sft, progress=progress)
  return model, CharTokenizer(model.cfg.vocab_size), summary


def _tiny(c, tok, num_prompts: int, seed: int, difficulty: dict, reward: str):
  task = arithmetic.TaskConfig.from_dict(c.sft.task)
  _, max_new = task_lengths(task)
  problems = arithmetic.make_problems(num_prompts, narrowed(task, difficulty), seed=seed)
  prompts = [arithmetic.encode_prompt(tok, p) for p in problems]
  if reward == "answer":
    reward_fn = lambda ids, p: arithmetic.reward(tok.decode(ids), p.answer)
  else:  # "progress": partial credit for the scratchpad steps before the first error
    reward_fn = lambda ids, p: arithmetic.progress_reward(tok.decode(ids), p)
  return prompts, problems, max_new, reward_fn


def _smollm2_policy(c, progress: bool):
  del c, progress
  model, tok = load_pretrained("smollm2")
  return model, tok, {"cache": "smollm2", "cached": True}


def _smollm2(c, tok, num_prompts: int, seed: int, difficulty: dict, reward: str):
  del reward  # only "answer"
  problems = make_word_problems(
      num_prompts, narrowed(WordProblemConfig(**c.word_problems), difficulty), seed)
  prompts = [tok.encode(chat_prompt(tok, p.question, c.instruction)) for p in problems]
  reward_fn = lambda ids, ans: verify(tok.decode(ids), ans)
  return prompts, [p.answer for p in problems], c.max_new_tokens, reward_fn


register_workload("tiny", WorkloadKind(("answer", "progress"), _tiny_policy, _tiny))
register_workload("smollm2", WorkloadKind(("answer",), _smollm2_policy, _smollm2))


def starting_policy(c: ml_collections.ConfigDict, progress: bool = True):
  """`c.model`'s policy before RL: (model, tokenizer, summary). For `tiny` the SFT warm start:
  shipped, cached, or trained and cached (`summary` says which)."""
  return get_workload(c.model).policy(c, progress)


def build_workload(c: ml_collections.ConfigDict, num_prompts: int, seed: int,
                   difficulty: dict | None = None, *, policy=None) -> Workload:
  """Model, tokenised prompts, answers, sampling params and reward for `c.model`.

  `policy` is `starting_policy(c)`'s (model, tokenizer, ...), found again when not given.

  `difficulty` overrides fields of the task's problem generator (`tiny`: `TaskConfig`, e.g.
  `min_steps`/`max_steps`; `smollm2`: `WordProblemConfig`) for these prompts only, e.g. an RL
  prompt pool focused where groups get mixed rewards; lengths and sampling stay the task's own.
  """
  model, tok = (policy or starting_policy(c, progress=False))[:2]
  prompts, answers, max_new, reward_fn = get_workload(c.model).build(
      c, tok, num_prompts, seed, dict(difficulty or {}), reward_name(c))
  if c.get("max_new_tokens"):
    max_new = c.max_new_tokens
  params = SamplingParams(temperature=c.temperature, top_k=c.get("top_k", 0),
                          top_p=c.get("top_p", 1.0), max_new_tokens=max_new,
                          stop_tokens=(tok.eos_id,))
  return Workload(model, tok, prompts, answers, params, reward_fn)


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


def _drafter_warmup(c: ml_collections.ConfigDict, policy=None):
  """What `c`'s warm-up drafter is made from: the workload of `c.warmup_prompts` prompts (seed + 1)
  and the drafter, training and warm-up configs."""
  w = build_workload(c, c.warmup_prompts, c.seed + 1, policy=policy)
  dcfg = DrafterConfig(**{k: tuple(v) if k == "feature_layers" else v
                          for k, v in c.drafter.items()})
  return w, dcfg, DrafterTrainConfig(**c.drafter_train), WarmupConfig(**c.warmup)


def drafter_key(c: ml_collections.ConfigDict) -> str:
  """The key under which `c`'s warm-up drafter is cached or shipped (nothing is trained)."""
  w, dcfg, tcfg, wcfg = _drafter_warmup(c)
  return warmup_key(w.model, w.prompts, w.params, dcfg, tcfg, wcfg)


def build_drafter(c: ml_collections.ConfigDict, progress: bool = True, *, policy=None):
  """The warm-up EAGLE drafter of `c`'s policy (shipped, cached, or trained on rollouts of
  `c.warmup_prompts` prompts with `c.drafter`, `c.drafter_train` and `c.warmup`); returns
  (drafter, meta). `policy`: as for `build_workload`."""
  w, dcfg, tcfg, wcfg = _drafter_warmup(c, policy)
  return warm_up(w.model, w.prompts, w.params, pad_id=w.tokenizer.pad_id, dcfg=dcfg, tcfg=tcfg,
                 wcfg=wcfg, cache_root=c.cache_dir or sft.default_cache_dir(), progress=progress)
