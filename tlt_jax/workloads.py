"""The two workloads, built from a config: `tiny` on the built-in task (warm-started policy) and
`smollm2` on the procedural word problems. Used by the benchmarks and the trainer."""

from __future__ import annotations

import dataclasses

import ml_collections

from tlt_jax.evaluation import task_lengths
from tlt_jax.rollout.sampling import SamplingParams
from tlt_jax.tasks import arithmetic
from tlt_jax.tasks.tokenizer import CharTokenizer


@dataclasses.dataclass
class Workload:
  model: object
  tokenizer: object
  prompts: list[list[int]]
  answers: list
  params: SamplingParams
  reward_fn: object  # (response ids, answer) -> float


def build_workload(c: ml_collections.ConfigDict, num_prompts: int, seed: int) -> Workload:
  """Model, tokenised prompts, answers, sampling params and reward for `c.model`."""
  if c.model == "tiny":
    from tlt_jax import sft
    model, _ = sft.warm_start(c.sft)
    tok = CharTokenizer(model.cfg.vocab_size)
    task = arithmetic.TaskConfig.from_dict(c.sft.task)
    problems = arithmetic.make_problems(num_prompts, task, seed=seed)
    _, max_new = task_lengths(task)
    prompts = [arithmetic.encode_prompt(tok, p) for p in problems]
    answers = [p.answer for p in problems]
    reward = lambda ids, ans: arithmetic.reward(tok.decode(ids), ans)
  elif c.model == "smollm2":
    from tlt_jax.models.pretrained import load_pretrained
    from tlt_jax.tasks.math_answers import verify
    from tlt_jax.tasks.math_data import chat_prompt
    from tlt_jax.tasks.word_problems import WordProblemConfig, make_word_problems
    model, tok = load_pretrained("smollm2")
    problems = make_word_problems(num_prompts, WordProblemConfig(**c.word_problems), seed)
    prompts = [tok.encode(chat_prompt(tok, p.question, c.instruction)) for p in problems]
    answers = [p.answer for p in problems]
    max_new = c.max_new_tokens
    reward = lambda ids, ans: verify(tok.decode(ids), ans)
  else:
    raise ValueError(f"Unknown workload model {c.model!r}; use 'tiny' or 'smollm2'.")
  if c.get("max_new_tokens"):
    max_new = c.max_new_tokens
  params = SamplingParams(temperature=c.temperature, top_k=c.get("top_k", 0),
                          top_p=c.get("top_p", 1.0), max_new_tokens=max_new,
                          stop_tokens=(tok.eos_id,))
  return Workload(model, tok, prompts, answers, params, reward)


def build_drafter(c: ml_collections.ConfigDict, progress: bool = True):
  """The cached warm-up EAGLE drafter of `c`'s policy, trained on rollouts of `c.warmup_prompts`
  prompts (seed + 1) with `c.drafter`, `c.drafter_train` and `c.warmup`; returns (drafter, meta)."""
  from tlt_jax.drafter.model import DrafterConfig
  from tlt_jax.drafter.train import DrafterTrainConfig
  from tlt_jax.drafter.warmup import WarmupConfig, warm_up
  from tlt_jax.sft import default_cache_dir
  w = build_workload(c, c.warmup_prompts, c.seed + 1)
  dcfg = DrafterConfig(**{k: tuple(v) if k == "feature_layers" else v
                          for k, v in c.drafter.items()})
  return warm_up(w.model, w.prompts, w.params, pad_id=w.tokenizer.pad_id, dcfg=dcfg,
                 tcfg=DrafterTrainConfig(**c.drafter_train), wcfg=WarmupConfig(**c.warmup),
                 cache_root=c.cache_dir or default_cache_dir(), progress=progress)
