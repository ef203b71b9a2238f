"""Sampling evaluation of a policy: reward (accuracy), response lengths, mixed-reward groups."""

from __future__ import annotations

import jax
import numpy as np
from tqdm import tqdm

from tlt_jax.models.sampling import SamplingParams
from tlt_jax.models.tokenizer import CharTokenizer
from tlt_jax.rollout.plain import generate_plain
from tlt_jax.tasks import arithmetic
from tlt_jax.tasks.math_answers import verify
from tlt_jax.tasks.math_data import INSTRUCTION, MathProblem, chat_prompt


def task_lengths(task: arithmetic.TaskConfig) -> tuple[int, int]:
  """(prompt bucket, max new tokens) that fit every problem of `task`."""
  prompt = task.max_prompt_chars() + 1
  return int(-(-prompt // 16) * 16), task.max_solution_chars() + 1


def group_stats(rewards_NxG: np.ndarray, lengths: np.ndarray,
                mixed_over_NxG: np.ndarray | None = None) -> dict:
  """Accuracy (the mean of `rewards_NxG`), response-length percentiles and the fraction of
  groups with mixed rewards (over `mixed_over_NxG` when given: e.g. shaped rewards beside 0/1
  correctness)."""
  by = rewards_NxG if mixed_over_NxG is None else mixed_over_NxG
  mixed = (by.max(axis=1) > by.min(axis=1)).mean()
  return {
      "accuracy": float(rewards_NxG.mean()),
      "length_p50": float(np.percentile(lengths, 50)),
      "length_p90": float(np.percentile(lengths, 90)),
      "length_p99": float(np.percentile(lengths, 99)),
      "length_max": int(lengths.max()),
      "mixed_group_fraction": float(mixed),
  }


def _score_groups(model, prompts: list[list[int]], score, *, group_size: int,
                  params: SamplingParams, seed: int, rows_per_call: int, pad_id: int,
                  prompt_bucket: int, progress: bool = False) -> dict:
  """Samples `group_size` responses per prompt in chunks; `score(prompt_index, ids) -> reward`."""
  rows = [p for p in prompts for _ in range(group_size)]
  key = jax.random.key(seed)
  rewards, lengths = [], []
  starts = range(0, len(rows), rows_per_call)
  for start in tqdm(starts, desc="eval", disable=not progress):
    chunk = rows[start: start + rows_per_call]
    ids = np.arange(start, start + len(chunk))
    gen = generate_plain(model, chunk, key, params, sample_ids=ids, prompt_bucket=prompt_bucket,
                         pad_id=pad_id)
    for r in range(len(chunk)):
      rewards.append(score((start + r) // group_size, gen.response(r)))
      lengths.append(int(gen.lengths[r]))
  return group_stats(np.array(rewards).reshape(len(prompts), group_size), np.array(lengths))


def evaluate_task(model, task: arithmetic.TaskConfig, *, num_prompts: int, group_size: int,
                  temperature: float = 1.0, seed: int = 0, rows_per_call: int = 256) -> dict:
  """Samples `group_size` responses for each of `num_prompts` distinct held-out problems (fewer
  when the task's held-out side has fewer) and scores them."""
  tok = CharTokenizer(model.cfg.vocab_size)
  problems = arithmetic.make_problems(num_prompts, task, seed, "test")
  prompt_bucket, max_new = task_lengths(task)
  params = SamplingParams(temperature=temperature, max_new_tokens=max_new,
                          stop_tokens=tok.stop_ids)
  prompts = [arithmetic.encode_prompt(tok, p) for p in problems]
  score = lambda i, ids: arithmetic.reward(tok.decode(ids), problems[i].answer)
  return _score_groups(model, prompts, score, group_size=group_size, params=params, seed=seed,
                       rows_per_call=rows_per_call, pad_id=tok.pad_id, prompt_bucket=prompt_bucket)


def evaluate_math(model, tokenizer, problems: list[MathProblem], *, group_size: int,
                  temperature: float, max_new_tokens: int, seed: int = 0, rows_per_call: int = 16,
                  progress: bool = True, instruction: str = INSTRUCTION) -> dict:
  """Samples chat-formatted answers to math problems and verifies their final answers."""
  prompts = [tokenizer.encode(chat_prompt(tokenizer, p.question, instruction)) for p in problems]
  bucket = int(-(-max(len(p) for p in prompts) // 32) * 32)
  params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens,
                          stop_tokens=tokenizer.stop_ids)
  score = lambda i, ids: verify(tokenizer.decode(ids), problems[i].answer)
  return _score_groups(model, prompts, score, group_size=group_size, params=params, seed=seed,
                       rows_per_call=rows_per_call, pad_id=tokenizer.pad_id, prompt_bucket=bucket,
                       progress=progress)
