"""The built-in task: tokenizer, reward, and the length tail of its solutions."""

import numpy as np
import pytest

from tlt_jax.models.tokenizer import CharTokenizer
from tlt_jax.tasks import arithmetic
from tlt_jax.tasks.word_problems import WordProblemConfig
from tlt_jax.workloads import narrowed


def test_tokenizer_round_trips_and_rejects_foreign_characters():
  tok = CharTokenizer()
  for p in arithmetic.make_problems(50, arithmetic.TaskConfig(), 0, "train"):
    assert tok.decode(tok.encode(p.prompt + p.solution)) == p.prompt + p.solution
  assert tok.decode(tok.encode("1+2=3;") + [tok.eos_id] + tok.encode("99")) == "1+2=3;"
  with pytest.raises(ValueError, match="not in the task alphabet"):
    tok.encode("x")


def test_solutions_are_correct_and_rewarded():
  for p in arithmetic.make_problems(200, arithmetic.TaskConfig(), 1, "train"):
    total = eval(p.prompt[:-1])  # the chain itself, left to right
    assert p.answer == total
    assert arithmetic.reward(p.solution, p.answer) == 1.0
    assert p.solution.count(";") == p.steps


@pytest.mark.parametrize("response,reward", [
    ("3+4=7;#7", 1.0),
    ("3+4=7;#8", 0.0),          # wrong answer
    ("3+4=8;#7", 1.0),          # scratchpad slip, right final answer: the final answer is graded
    ("#7", 1.0),
    ("3+4=7;", 0.0),            # no final answer
    ("3+4=7;#7#7", 0.0),        # two answers
    ("3+4=7#7", 0.0),           # malformed step
    ("3+4=7;#", 0.0),
    ("3+4=7;# 7", 0.0),
    ("", 0.0),
])
def test_reward_on_correct_wrong_and_malformed(response, reward):
  assert arithmetic.reward(response, 7) == reward


def test_solution_lengths_are_long_tailed():
  lens = np.array([len(p.solution) + 1 for p in arithmetic.make_problems(
      4000, arithmetic.TaskConfig(), 2, "train")])
  assert np.percentile(lens, 99) >= 5 * np.percentile(lens, 50)
  assert lens.max() <= arithmetic.TaskConfig().max_solution_chars() + 1


def test_bad_task_config_is_a_clear_error():
  with pytest.raises(ValueError, match="min_steps <= max_steps"):
    arithmetic.TaskConfig(min_steps=5, max_steps=2)


def test_the_rl_pool_may_narrow_the_difficulty_mix_but_not_lengthen_it():
  task = arithmetic.TaskConfig()
  mix = narrowed(task, {"min_steps": 2, "max_steps": 4})
  steps = {p.steps for p in arithmetic.make_problems(300, mix, 0, "train")}
  assert steps == {2, 3, 4} and mix.alpha == task.alpha
  assert narrowed(task, {}) == task
  with pytest.raises(ValueError, match="Unknown difficulty field.*max_step"):
    narrowed(task, {"max_step": 4})
  with pytest.raises(ValueError, match="longer problems"):
    narrowed(arithmetic.TaskConfig(max_steps=4), {"max_steps": 8})
  assert narrowed(WordProblemConfig(), {"max_steps": 1}).max_steps == 1


def test_progress_reward_credits_the_steps_before_the_first_error():
  p = arithmetic.Problem("7-4+1+6=", "7-4=3;3+1=4;4+6=10;#10", 10, 3)
  assert arithmetic.progress_reward(p.solution, p) == 1.0
  assert arithmetic.progress_reward("7-4=3;3+1=4;4+6=11;#11", p) == pytest.approx(0.5 * 2 / 3)
  assert arithmetic.progress_reward("7-4=3;3+2=5;5+6=11;#11", p) == pytest.approx(0.5 * 1 / 3)
  assert arithmetic.progress_reward("7-0=7;7+1=8;8+6=14;#14", p) == 0.0
  # Every step right but a miswritten answer is still not a correct answer.
  assert arithmetic.progress_reward("7-4=3;3+1=4;4+6=10;#11", p) == pytest.approx(0.5)
  assert arithmetic.progress_reward("#10", p) == 1.0  # the answer is what is graded
  for q in arithmetic.make_problems(100, arithmetic.TaskConfig(), 3, "train"):
    assert arithmetic.progress_reward(q.solution, q) == 1.0
