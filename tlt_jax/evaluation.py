"""Sampling evaluation of a policy on the built-in task: accuracy, lengths, mixed groups."""

from __future__ import annotations

import jax
import numpy as np

from tlt_jax.rollout.plain import generate_plain
from tlt_jax.rollout.sampling import SamplingParams
from tlt_jax.tasks import arithmetic
from tlt_jax.tasks.tokenizer import CharTokenizer


def task_lengths(task: arithmetic.TaskConfig) -> tuple[int, int]:
  """(prompt bucket, max new tokens) that fit every problem of `task`."""
  prompt = task.max_prompt_chars() + 1
  return int(-(-prompt // 16) * 16), task.max_solution_chars() + 1


def group_stats(rewards_NxG: np.ndarray, lengths: np.ndarray) -> dict:
  """Accuracy, response-length percentiles and the fraction of groups with mixed rewards."""
  mixed = (rewards_NxG.max(axis=1) > rewards_NxG.min(axis=1)).mean()
  return {
      "accuracy": float(rewards_NxG.mean()),
      "length_p50": float(np.percentile(lengths, 50)),
      "length_p90": float(np.percentile(lengths, 90)),
      "length_p99": float(np.percentile(lengths, 99)),
      "length_max": int(lengths.max()),
      "mixed_group_fraction": float(mixed),
  }


def evaluate_task(model, task: arithmetic.TaskConfig, *, num_prompts: int, group_size: int,
                  temperature: float = 1.0, seed: int = 0, rows_per_call: int = 256) -> dict:
  """Samples `group_size` responses for each of `num_prompts` fresh problems and scores them."""
  tok = CharTokenizer(model.cfg.vocab_size)
  problems = arithmetic.make_problems(num_prompts, task, seed=seed)
  prompt_bucket, max_new = task_lengths(task)
  params = SamplingParams(temperature=temperature, max_new_tokens=max_new,
                          stop_tokens=(tok.eos_id,))
  prompts = [arithmetic.encode_prompt(tok, p) for p in problems for _ in range(group_size)]
  key = jax.random.key(seed)
  rewards, lengths = [], []
  for start in range(0, len(prompts), rows_per_call):
    chunk = prompts[start: start + rows_per_call]
    ids = np.arange(start, start + len(chunk))
    gen = generate_plain(model, chunk, key, params, sample_ids=ids, prompt_bucket=prompt_bucket)
    for r in range(len(chunk)):
      text = tok.decode(gen.response(r))
      rewards.append(arithmetic.reward(text, problems[(start + r) // group_size].answer))
      lengths.append(int(gen.lengths[r]))
  return group_stats(np.array(rewards).reshape(num_prompts, group_size), np.array(lengths))
