"""Your model, your data: dataset files in every format read, rewards by name, held-out prompts
kept apart from the training pool, stop tokens from `generation_config.json`, and GRPO / TLT runs
of a tiny random Qwen2 checkpoint on a 64-row GSM8K-format file through `hf_math.py`."""

import dataclasses
import json
import os
import sys

import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from experiments.configs import hf_math
from tests.test_launchers import last_json, run_module
from tlt_jax.errors import ConfigError
from tlt_jax.models.pretrained import load_pretrained
from tlt_jax.rl.config import run_config
from tlt_jax.rl.run import build_trainer
from tlt_jax.tasks import rewards
from tlt_jax.tasks.datasets import load_examples

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.models.test_pretrained import _hf_tokenizer  # noqa: E402


def reward_of_length(response_text, answer):
  """A user reward for the `module:function` test."""
  return float(len(response_text) > 0)


def _checkpoint(directory):
  """A tiny random Qwen2 folder with a chat tokenizer and a generation config listing two stop
  ids (eos and one more)."""
  torch.manual_seed(0)
  cfg = transformers.Qwen2Config(vocab_size=320, hidden_size=64, intermediate_size=112,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=512,
                                 tie_word_embeddings=False, rope_theta=1e6)
  transformers.Qwen2ForCausalLM(cfg).float().save_pretrained(directory, safe_serialization=True)
  tok = _hf_tokenizer(directory)
  with open(os.path.join(directory, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": [tok.eos_token_id, 7]}, f)
  return directory


def _gsm8k(path, n=64, start=0):
  with open(path, "w") as f:
    for i in range(start, start + n):
      f.write(json.dumps({"question": f"{i} + {i % 7}?", "answer": f"so\n#### {i + i % 7}"}) + "\n")
  return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = tmp_path_factory.mktemp("hf_math")
  return (_checkpoint(str(d / "qwen2")), _gsm8k(d / "train.jsonl"),
          _gsm8k(d / "test.jsonl", n=16, start=1000))


def test_every_format_reads_and_a_bad_row_names_its_file_and_row(tmp_path):
  rows = {"gsm.jsonl": [{"question": "1+1?", "answer": "1+1=2\n#### 2"}],
          "math.json": [{"problem": "x?", "solution": "so $\\boxed{\\frac{1}{2}}$."}],
          "plain.jsonl": [{"prompt": "p", "answer": "3"}]}
  for name, content in rows.items():
    text = (json.dumps(content) if name.endswith(".json")
            else "\n".join(json.dumps(r) for r in content))
    (tmp_path / name).write_text(text)
  assert load_examples(str(tmp_path / "gsm.jsonl"))[0].answer == "2"
  assert load_examples(str(tmp_path / "math.json"))[0].answer == "\\frac{1}{2}"
  assert load_examples(str(tmp_path / "plain.jsonl"))[0].prompt == "p"
  verl = str(tmp_path / "verl.parquet")
  pq.write_table(pa.table({"prompt": [[{"role": "user", "content": "2*3?"}]],
                           "reward_model": [{"ground_truth": "6", "style": "rule"}]}), verl)
  e = load_examples(verl)[0]
  assert e.prompt == ({"role": "user", "content": "2*3?"},) and e.answer == "6"
  custom = tmp_path / "custom.jsonl"
  custom.write_text(json.dumps({"q": "a?", "gold": "5"}) + "\n")
  assert load_examples(str(custom), "q", "gold")[0].answer == "5"
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"question": "ok?", "answer": "#### 1"}) + "\n" + json.dumps(
      {"question": "no answer mark", "answer": "1"}) + "\n")
  with pytest.raises(ConfigError, match=r"bad.jsonl, row 2: a GSM8K answer must end with"):
    load_examples(str(bad))
  with pytest.raises(ConfigError, match=r"custom.jsonl, row 1: no column 'question'"):
    load_examples(str(custom), "question", "gold")


def test_rewards_by_name_sums_and_user_functions(monkeypatch):
  assert rewards.reward_fn("math")("so #### 4", "4") == 1.0
  assert rewards.reward_fn("format")("the answer is 4", "4") == 0.0
  assert rewards.reward_fn("math+format")("#### 4", "4") == 2.0
  boxed = rewards.reward_fn("boxed")  # equivalence, not string equality (math-verify)
  assert boxed("so \\boxed{\\frac{1}{2}}", "0.5") == 1.0 and boxed("\\boxed{3}", "0.5") == 0.0
  assert rewards.reward_fn("tests.test_hf_math:reward_of_length")("x", "1") == 1.0
  for name, message in (("maths", "'maths' is not a reward; known: math, boxed, format"),
                        ("no_such_module:f", "cannot import it"),
                        ("operator:add", None), ("os:sep", "a reward must be a function")):
    if message is None:
      rewards.reward_fn(name)  # two positional parameters: accepted
      continue
    with pytest.raises(ConfigError, match=message):
      rewards.reward_fn(name)
  monkeypatch.setitem(sys.modules, "math_verify", None)  # the optional extra not installed
  with pytest.raises(ConfigError,
                     match=r"'boxed' needs math-verify: pip install 'tlt_jax\[math\]'"):
    rewards.reward_fn("boxed")


def verl_probe(data_source, solution_str, ground_truth, extra_info=None):
  """A verl-signature reward that checks what it is given."""
  assert data_source == "train.jsonl" and isinstance(solution_str, str)
  assert extra_info["answer"].endswith(f"#### {ground_truth}") and "question" in extra_info
  return float(len(solution_str) % 2)


def trl_probe(prompts, completions, answer, question, **columns):
  """A TRL-signature reward that checks what it is given."""
  assert len(prompts) == len(completions) == len(answer) == len(question) > 1
  assert all(q in p for p, q in zip(prompts, question)) and "answer" not in columns
  return [float(len(c) % 2) for c in completions]


def test_rewards_of_verl_s_and_trl_s_signatures_read_the_rows(data):
  rows = load_examples(data[1])[:3]
  texts = ["so #### 1", "#### 5", "nothing"]
  want = [float(len(t) % 2) for t in texts]
  for name in ("tests.test_hf_math:verl_probe", "tests.test_hf_math:trl_probe"):
    assert rewards.batch_reward(name)(texts, rows) == want
  gold = [r.answer for r in rows]
  right = [f"so #### {a}" for a in gold]
  for name in ("experiments.example_rewards:verl_gsm8k", "experiments.example_rewards:trl_gsm8k"):
    assert rewards.batch_reward(name)(right + ["#### -1"], rows + rows[:1]) == [1.0] * 3 + [0.0]
  verl = rewards.batch_reward("tests.test_hf_math:verl_probe")
  with pytest.raises(AssertionError):  # data_source: the row's column wins over the file's name
    verl(texts[:1], [dataclasses.replace(rows[0], columns={**rows[0].columns,
                                                          "data_source": "openai/gsm8k"})])
  with pytest.raises(ConfigError, match=r"its parameters \(completions\) fit no reward form"):
    rewards.batch_reward("tests.test_hf_math:_one_arg")


def _one_arg(completions):
  return [0.0] * len(completions)


def _base_model(directory):
  """The chat checkpoint without its chat template: a base model."""
  _checkpoint(directory)
  cfg_path = os.path.join(directory, "tokenizer_config.json")
  cfg = json.load(open(cfg_path))
  cfg.pop("chat_template", None)
  json.dump(cfg, open(cfg_path, "w"))
  if os.path.exists(os.path.join(directory, "chat_template.jinja")):
    os.remove(os.path.join(directory, "chat_template.jinja"))
  return directory


def test_a_base_model_takes_its_prompts_as_text_with_task_chat_left_alone(data, tmp_path):
  base = _base_model(str(tmp_path / "base"))
  c = hf_math.get_config("small")
  c.model.path, c.task.dataset = base, data[1]
  tr = build_trainer(run_config(c), progress=False)
  text = tr.w.tokenizer.decode(tr.pool_prompts[0])
  assert "<|im_start|>" not in text and text.endswith(c.task.get("instruction", "") or
                                                     "after '####'.")
  c.task.chat = True
  with pytest.raises(ConfigError, match=r"config.task.chat=True, but the model's tokenizer has no "
                                        r"chat template \(a base model\)"):
    build_trainer(run_config(c), progress=False)
  c.model.path = str(tmp_path / "nowhere")
  with pytest.raises(ConfigError, match=r"^config.model.path='.*nowhere': "):
    build_trainer(run_config(c), progress=False)
  os.remove(os.path.join(base, "tokenizer.json"))
  c.model.path = base
  with pytest.raises(ConfigError, match=r"tokenizer.json is missing"):
    build_trainer(run_config(c), progress=False)


@pytest.mark.slow
def test_a_base_model_and_verl_and_trl_rewards_train(data, tmp_path):
  """Two GRPO steps each: a base model on GSM8K files with `task.chat` left alone and a verl
  reward, and the chat model with a TRL reward, from the example file."""
  base = _base_model(str(tmp_path / "base"))
  for name, path, reward in (("verl", base, "verl_gsm8k"), ("trl", data[0], "trl_gsm8k")):
    out = last_json(run_module(
        "experiments.train_grpo", "--config=experiments/configs/hf_math.py:small",
        f"--config.model.path={path}", f"--config.task.dataset={data[1]}",
        f"--config.out_dir={tmp_path / name}", "--config.train.eval_every=0",
        f"--config.task.reward=experiments.example_rewards:{reward}", timeout=900))
    assert out["steps"] == 2 and 0.0 <= out["reward_last"] <= 1.0


def _rc(data, variant="small", **task):
  path, train, test = data
  c = hf_math.get_config(variant)
  c.model.path, c.task.dataset = path, train
  c.task.update(task)
  return run_config(c)


def test_the_held_out_set_is_disjoint_distinct_and_stops_come_from_the_generation_config(data):
  for rc in (_rc(data, test_dataset=data[2]), _rc(data, test_fraction=0.25)):
    tr = build_trainer(rc, progress=False)
    pool = {tuple(p) for p in tr.pool_prompts}
    held = [tuple(p) for p in tr.eval_prompts]
    assert held and not pool & set(held) and len(set(held)) == len(held)
    assert tr.w.params.stop_tokens == (tr.w.tokenizer.eos_id, 7)


def test_bad_data_settings_are_one_line_errors(data, tmp_path):
  long = tmp_path / "long.jsonl"
  long.write_text(json.dumps({"question": "word " * 600, "answer": "#### 1"}) + "\n")
  with pytest.raises(ConfigError, match="Every training prompt is longer than"):
    build_trainer(_rc(data, dataset=str(long), test_dataset=data[2]), progress=False)
  with pytest.raises(ConfigError, match="config.task.reward='maths'"):
    _rc(data, reward="maths")
  with pytest.raises(ConfigError, match="config.model.path: the tiny workload has its own"):
    c = hf_math.get_config("small")
    c.model.name, c.model.path = "tiny", data[0]
    run_config(c)


@pytest.mark.slow
def test_grpo_and_tlt_runs_on_a_local_model_and_dataset_file(data, tmp_path):
  """Two GRPO steps baseline and TLT on the command line of the config's docstring: the same
  rewards under `coupled`, held-out evaluation, nothing compiled after the warm-up."""
  path, train, test = data
  outs = {}
  for variant in ("small", "tlt,small"):
    out = str(tmp_path / variant.replace(",", "_"))
    last_json(run_module(
        "experiments.train_grpo", f"--config=experiments/configs/hf_math.py:{variant}",
        f"--config.model.path={path}", f"--config.task.dataset={train}",
        f"--config.task.test_dataset={test}", f"--config.out_dir={out}",
        f"--config.cache_dir={tmp_path}/cache", "--config.train.export_every=1", timeout=900))
    metrics = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]
    assert len(metrics) == 2 and all(m["compile_events"] == 0 for m in metrics)
    assert "eval/accuracy" in metrics[0] and "eval/final_accuracy" in metrics[-1]
    record = json.load(open(os.path.join(out, "config.json")))  # the run's records
    assert record["config"]["workload"]["path"] == path and record["versions"]["jax"]
    assert record["config"]["learner"]["name"] == "grpo" and "git_commit" in record
    outs[variant] = [m["reward"] for m in metrics]
  assert outs["small"] == outs["tlt,small"]
  # The policy exported after step 1 loads in transformers with our logits.
  exported = str(tmp_path / "small" / "export" / "step_1" / "policy")
  model, tok = load_pretrained(exported)
  ids = np.array([tok.encode("12 + 5?")])
  hf = transformers.AutoModelForCausalLM.from_pretrained(exported).float().eval()
  with torch.no_grad():
    want = hf(torch.tensor(ids)).logits.numpy()
  np.testing.assert_allclose(np.asarray(model(jnp.asarray(ids)).logits_BxTxV), want, atol=1e-4)
  assert os.path.isdir(tmp_path / "tlt_small" / "export" / "drafter")
