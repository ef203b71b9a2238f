"""Math answers: a table of tricky cases; dataset loading; word problems."""

import json
from fractions import Fraction

import pytest

from tlt_jax.tasks.math_answers import extract_answer, verify
from tlt_jax.tasks.math_data import chat_prompt, load_math_dataset
from tlt_jax.tasks.word_problems import WordProblemConfig, make_word_problems

CASES = [
    ("so 3+4 = 7\n#### 7", "7", 1.0),
    ("#### 1,234", "1234", 1.0),                          # thousands separator
    ("The answer is $1,234.50.", "1234.5", 1.0),          # currency, decimals, trailing period
    ("\\boxed{\\frac{3}{4}}", "0.75", 1.0),               # TeX fraction equals decimal
    ("She ends with -5 degrees", "-5", 1.0),              # negative
    ("It costs 12 dollars.", "12", 1.0),                  # trailing unit
    ("42%", "42", 1.0),
    ("3/4 of the cake", "0.75", 1.0),                     # simple fraction
    ("0.50", "1/2", 1.0),
    ("total 1,000,000 km", "1000000", 1.0),
    ("#### 7\n#### 8", "7", 0.0),                         # conflicting final answers
    ("\\boxed{3} or maybe \\boxed{4}", "3", 0.0),
    ("the answer is 5, no wait, the answer is 6", "6", 0.0),
    ("The answer is 7. Indeed, the answer is 7.", "7", 1.0),  # repeated but consistent
    ("5 apples then 3 more gives 8", "8", 1.0),           # last number
    ("5 apples then 3 more gives 8", "5", 0.0),
    ("#### 12 apples", "12", 1.0),
    ("#### twelve", "12", 0.0),                           # no number after ####
    ("no numbers at all", "3", 0.0),
    ("The answer is 7 apples, and 8 pears were eaten", "8", 0.0),  # stated answer wins
]


@pytest.mark.parametrize("response,gold,reward", CASES)
def test_verifier_table(response, gold, reward):
  assert verify(response, gold) == reward


def test_extract_answer_is_exact():
  assert extract_answer("#### 0.1") == Fraction(1, 10)
  assert extract_answer("#### 2 \n #### 2.0") == 2


def test_loaders_gsm8k_generic_and_errors(tmp_path):
  gsm = tmp_path / "gsm.jsonl"
  gsm.write_text(json.dumps({"question": "1+1?", "answer": "1+1=2\n#### 2"}) + "\n")
  assert load_math_dataset(str(gsm))[0].answer == "2"
  gen = tmp_path / "gen.jsonl"
  gen.write_text(json.dumps({"prompt": "p", "answer": " 3/4 "}) + "\n\n")
  assert load_math_dataset(str(gen))[0].answer == "3/4"
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"q": 1}) + "\n")
  with pytest.raises(ValueError, match="bad.jsonl, row 1: columns q fit no known format"):
    load_math_dataset(str(bad))
  broken = tmp_path / "broken.jsonl"
  broken.write_text("{not json\n")
  with pytest.raises(ValueError, match="broken.jsonl, row 1: not valid JSON"):
    load_math_dataset(str(broken))
  with pytest.raises(ValueError, match="does not exist"):
    load_math_dataset(str(tmp_path / "missing.jsonl"))


def test_parquet_loader(tmp_path):
  pa = pytest.importorskip("pyarrow")
  import pyarrow.parquet as pq
  path = str(tmp_path / "gsm.parquet")
  pq.write_table(pa.table({"question": ["2*3?"], "answer": ["#### 6"]}), path)
  assert load_math_dataset(path)[0].answer == "6"


def test_word_problems_are_consistent():
  problems = make_word_problems(200, WordProblemConfig(max_steps=3), 0, "train")
  assert len({p.question for p in problems}) > 150
  for p in problems:
    assert int(p.answer) >= 0 and p.question.endswith("now?")


class _Template:
  def apply_chat_template(self, messages, add_generation_prompt=True):
    return f"<user>{messages[0]['content']}</user><assistant>"


def test_chat_prompt_wraps_question_and_instruction():
  out = chat_prompt(_Template(), "What is 2+2?")
  assert out.startswith("<user>What is 2+2?\n") and "####" in out
