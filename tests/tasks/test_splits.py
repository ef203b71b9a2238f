"""Held-out means disjoint: the stable hash split of prompt space, drawing from one side, and,
for every workload, no held-out prompt among the RL pool, the drafter's warm-up prompts or (for
`tiny`) the SFT data."""

import json

import ml_collections
import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from experiments.configs import base
from tlt_jax import sft
from tlt_jax.models.tokenizer import CharTokenizer, TextTokenizer
from tlt_jax.models.config import get_preset
from tlt_jax.tasks import arithmetic, splits
from tlt_jax.tasks.word_problems import WordProblemConfig, make_word_problem
from tlt_jax.workloads import build_workload, drafter_recipe, drafter_workload, workload_config

_TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
             "{% if add_generation_prompt %}<assistant>{% endif %}")


def _text_tokenizer() -> TextTokenizer:
  """A byte-level tokenizer with a chat template: what the prompt texts need, nothing more."""
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(["a"], trainers.BpeTrainer(
      vocab_size=300, special_tokens=["<eos>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  return TextTokenizer(tok, bos_token=None, eos_token="<eos>", chat_template=_TEMPLATE)


def test_the_split_is_stable_and_near_its_fraction():
  texts = [f"problem {i}" for i in range(4000)]
  side = [splits.held_out(t, 0.1) for t in texts]
  assert side == [splits.held_out(t, 0.1) for t in texts]  # the same on every call and machine
  assert 0.08 < np.mean(side) < 0.12  # 400 expected, sd 19: within 4 sd


def test_draw_keeps_to_its_side_and_the_held_out_side_is_distinct():
  cfg = arithmetic.TaskConfig()
  train = arithmetic.make_problems(3000, cfg, 0, "train")
  test = arithmetic.make_problems(256, cfg, 7919, "test")
  assert len(train) == 3000 and len(test) == 256
  assert not any(splits.held_out(p.prompt, cfg.test_fraction) for p in train)
  assert all(splits.held_out(p.prompt, cfg.test_fraction) for p in test)
  assert len({p.prompt for p in test}) == 256
  assert len({p.prompt for p in train}) < 3000  # the training side repeats as drawn
  assert test == arithmetic.make_problems(256, cfg, 7919, "test")  # seeded
  # A small prompt space runs dry: one-step chains of 0..2 hold 15 prompts, ~3 held out.
  tiny_space = arithmetic.TaskConfig(max_steps=1, max_operand=2, test_fraction=0.2)
  few = arithmetic.make_problems(50, tiny_space, 0, "test")
  assert 0 < len(few) < 15 and len({p.prompt for p in few}) == len(few)
  with pytest.raises(ValueError, match="test_fraction must be in"):
    arithmetic.TaskConfig(test_fraction=0.0)
  with pytest.raises(ValueError, match="split must be"):
    splits.draw(lambda rng: 0, str, 1, 0, "val", 0.1)


def test_the_generators_do_reach_the_held_out_side():
  """Power of the disjointness test below: drawn without the split, the generators' training-
  sized samples hold many held-out prompts."""
  rng = np.random.default_rng(0)
  raw = [arithmetic.make_problem(rng, arithmetic.TaskConfig()).prompt for _ in range(3000)]
  assert sum(splits.held_out(t, 0.2) for t in raw) > 300
  raw = [make_word_problem(rng, WordProblemConfig()).question for _ in range(3000)]
  assert sum(splits.held_out(t, 0.1) for t in raw) > 150


def _config(name, tmp_path):
  c = ml_collections.ConfigDict()
  c.cache_dir = str(tmp_path)
  if name == "tiny":
    c.model, c.task, c.rollout = base.tiny_model(), base.tiny_task(), base.rollout()
  elif name == "smollm2":
    c.model, c.task = ml_collections.ConfigDict({"name": "smollm2"}), base.word_problems_task()
    c.rollout = base.rollout(max_new_tokens=64)
  else:
    c.model = ml_collections.ConfigDict({"name": "math", "path": "unused"})
    c.task = ml_collections.ConfigDict({"reward": "math"})
    if name == "math-file":
      path = tmp_path / "train.jsonl"
      path.write_text("".join(json.dumps({"question": f"{i % 700} + {i % 13}?",
                                          "answer": f"#### {i % 700 + i % 13}"}) + "\n"
                              for i in range(2000)))  # repeated rows too
      c.task.dataset = str(path)
    c.rollout = base.rollout(max_new_tokens=64)
  return c


@pytest.mark.parametrize("name", ["tiny", "smollm2", "math-generated", "math-file"])
def test_no_held_out_prompt_occurs_in_any_training_data(name, tmp_path):
  c = _config(name, tmp_path)
  wc = workload_config(c)
  tok = (CharTokenizer(get_preset("tiny").vocab_size) if name == "tiny" else _text_tokenizer())
  policy = (None, tok)
  pool = build_workload(wc, 3000, 0, policy=policy).prompts
  recipe = drafter_recipe({"warmup_prompts": 256})
  warmup = drafter_workload(wc, recipe, 0, policy=policy).prompts
  held = build_workload(wc, 256, 7919, policy=policy, split="test").prompts
  training = {tuple(p) for p in pool + warmup}
  if name == "tiny":  # the warm start's SFT data, as the prompts the policy is trained on
    sft_config = base.warm_start(small=True)  # the recipe's data, 2,000 problems of it
    training |= {tuple(arithmetic.encode_prompt(tok, p))
                 for p in sft.training_problems(sft_config)}
  held_set = {tuple(p) for p in held}
  assert len(held_set) == len(held) > 20  # distinct, and enough to score
  assert not held_set & training
