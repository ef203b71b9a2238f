"""A drafter exported in the EAGLE-1 layout is checked against the serving side, not against
ourselves: a PyTorch forward written from vLLM's EAGLE-1 model (`experiments/benchmarks/served.py`'s
`Eagle1`, from `vllm/model_executor/models/llama_eagle.py`: `fc` over [token embedding, target hidden] without a
bias, decoder layer 0 without its input norm, no output norm, the target's head on the layer's
output; Hugging Face's rotate-half RoPE) reads only the exported folder and the target's embedding
and head, and gives the logits our "eagle" drafter gives."""

import json

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from tests.conftest import small_config
from tests.spec.test_spec_engine import _prompts, peaked_model
from tests.test_launchers import run_module
from tlt_jax.drafter.serving import export_drafter
from tlt_jax.drafter.model import DrafterConfig, init_drafter
from tlt_jax.drafter.proposer import as_proposer
from tlt_jax.drafter.warmup import drafter_artifact_config, load_any_drafter, save_drafter
from tlt_jax.models import init_model
from tlt_jax.models.pretrained import save_pretrained
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.models.tokenizer import CharTokenizer
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.spec.strategy import SpecConfig, Strategy


def _perturbed(module, seed):
  """`module` with every parameter moved off its initial value (norm scales included)."""
  state = nnx.state(module, nnx.Param)
  leaves, tree = jax.tree.flatten(state)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  nnx.update(module, jax.tree.unflatten(tree, [
      x + 0.2 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]))
  return module


def _vllm_eagle1_logits(folder, target, tokens, hidden) -> np.ndarray:
  """The logits of the vLLM-derived PyTorch forward (`served.Eagle1`) of the drafter folder, fed
  the target's embedding and head. torch is imported here, not at the top: a pytest worker that
  collects this file without running it does not pay for it."""
  import torch
  from experiments.benchmarks.served import Eagle1
  table = torch.from_numpy(np.array(target.embed.embedding[...]))
  head = table if target.cfg.tie_embeddings else torch.from_numpy(
      np.asarray(target.lm_head.kernel[...]).T.copy())
  theirs, _ = Eagle1(folder, table, head).forward(torch.from_numpy(np.array(tokens)),
                                                   torch.from_numpy(np.array(hidden)))
  return theirs.numpy()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_an_exported_eagle_drafter_gives_vllm_s_eagle1_logits(tmp_path, family):
  """Interleaved RoPE (a GGUF's) and grouped-query heads; Qwen2 adds q/k/v biases."""
  target = init_model(small_config(rope_layout="interleaved", family=family), seed=0)
  drafter = _perturbed(init_drafter(target.cfg, DrafterConfig(architecture="eagle"), seed=1), 2)
  assert export_drafter(drafter, tmp_path) == []  # nothing differs
  tokens = jax.random.randint(jax.random.key(3), (12,), 0, target.cfg.vocab_size)
  hidden = jax.random.normal(jax.random.key(4), (12, target.cfg.d_model))
  g, _ = drafter(target.embed_tokens(tokens[None]), hidden[None])
  ours = np.asarray(drafter.logits(target, g))[0]
  np.testing.assert_allclose(_vllm_eagle1_logits(tmp_path, target, tokens, hidden), ours,
                             atol=1e-4, rtol=0)
  assert np.abs(ours).max() > 0.1  # the logits are not all near zero
  tensors = load_file(tmp_path / "model.safetensors")
  assert "layers.0.input_layernorm.weight" not in tensors and not tensors["fc.bias"].any()
  config = json.loads((tmp_path / "config.json").read_text())
  assert config["num_hidden_layers"] == 1 and config["hidden_size"] == target.cfg.d_model
  assert "vllm serve" in (tmp_path / "README.md").read_text()


def test_an_eagle_drafter_is_that_layout_and_a_new_field_keeps_the_old_keys():
  target = init_model(small_config(), seed=0)
  eagle = init_drafter(target.cfg, DrafterConfig(architecture="eagle"))
  tlt = init_drafter(target.cfg, DrafterConfig())
  assert eagle.fc.bias is None and eagle.layer.input_norm is None and eagle.norm is None
  assert tlt.fc.bias is not None and tlt.layer.input_norm is not None and tlt.norm is not None
  with pytest.raises(ValueError, match="architecture must be one of"):
    DrafterConfig(architecture="medusa")
  with pytest.raises(ValueError, match="leave feature_layers empty"):
    DrafterConfig(architecture="eagle", feature_layers=(0, 1))


def test_what_the_served_drafter_does_otherwise_is_said_one_line_each(tmp_path):
  """A 'tlt' drafter with a restricted vocabulary, exported from the command line: one note for
  its norms and fc bias, one for its vocabulary, in the README too."""
  target = init_model(small_config(), seed=0)
  save_pretrained(target, CharTokenizer(target.cfg.vocab_size), tmp_path / "policy")
  drafter = init_drafter(target.cfg, DrafterConfig(draft_vocab=8, vocab_ids=tuple(range(8))))
  save_drafter(drafter, str(tmp_path / "drafter"), {})
  out = run_module("experiments.export_drafter", f"--drafter={tmp_path / 'drafter'}",
                   f"--model={tmp_path / 'policy'}", f"--out={tmp_path / 'served'}", timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  notes = [line for line in out.stdout.splitlines() if line.startswith("[export] note:")]
  assert len(notes) == 2 and "norm" in notes[0] and "8-token draft vocabulary" in notes[1]
  readme = (tmp_path / "served" / "README.md").read_text()
  assert "8-token draft vocabulary" in readme and "--speculative-draft-model-path" in readme
  tensors = load_file(tmp_path / "served" / "model.safetensors")
  np.testing.assert_array_equal(tensors["fc.bias"], np.asarray(drafter.fc.bias[...]))
  other = run_module("experiments.export_drafter", "--drafter=nowhere",
                     f"--model={tmp_path / 'policy'}", f"--out={tmp_path / 'x'}", timeout=300)
  assert other.returncode != 0 and len(other.stderr.strip().splitlines()) == 1
  assert "No drafter 'nowhere'" in other.stderr


def test_an_exported_folder_imports_as_the_same_drafter_and_drafts_exactly(tmp_path):
  """Export then `drafter.init_from=DIR`'s loader: the same logits bit for bit (a GGUF's
  interleaved RoPE permuted there and back), and greedy speculative decoding through the engine
  gives plain decoding's tokens."""
  target = peaked_model()
  target = init_model(target.cfg.replace(rope_layout="interleaved"), seed=0)
  drafter = _perturbed(init_drafter(target.cfg, DrafterConfig(architecture="eagle"), seed=1), 2)
  export_drafter(drafter, tmp_path / "served")
  back, meta = load_any_drafter(str(tmp_path / "served"), target)
  assert meta == {"notes": []} and back.cfg.architecture == "eagle"
  for a, b in zip(jax.tree.leaves(nnx.state(back, nnx.Param)),
                  jax.tree.leaves(nnx.state(drafter, nnx.Param))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert drafter_artifact_config(str(tmp_path / "served")).architecture == "eagle"
  params = SamplingParams(temperature=0.0, max_new_tokens=12)
  engine = lambda **kw: RolloutEngine(target, EngineConfig(batch_buckets=(4,), max_batch=4), **kw)
  prompts = _prompts(2, seed=4)
  plain = engine().generate(prompts, 2, params, jax.random.key(0))
  sd = engine(spec=SpecConfig(threshold=16, arms=(Strategy("eagle", depth=2),),
                              min_accept_len=0.0),
              drafter=as_proposer(back)).generate(prompts, 2, params, jax.random.key(0))
  np.testing.assert_array_equal(sd.tokens, plain.tokens)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_released_style_folder_imports_as_vllm_reads_it_and_a_bad_one_is_one_line(tmp_path,
                                                                                     family):
  """A folder as the original EAGLE-1 releases are (fc with a bias, a layer-0 input norm; for a
  Qwen2 target, q/k/v biases in its layer) imports as vLLM reads it, both left out (one note
  each), and gives the vLLM-derived forward's logits; folders that do not fit say what, in one
  line."""
  target = init_model(small_config(family=family), seed=0)
  drafter = _perturbed(init_drafter(target.cfg, DrafterConfig(architecture="eagle"), seed=1), 2)
  folder = tmp_path / "released"
  export_drafter(drafter, folder)
  tensors = load_file(folder / "model.safetensors")
  d = target.cfg.d_model
  tensors["fc.bias"] = np.full(d, 0.5, np.float32)
  tensors["layers.0.input_layernorm.weight"] = np.full(d, 3.0, np.float32)
  save_file(tensors, folder / "model.safetensors")
  back, meta = load_any_drafter(str(folder), target)
  assert len(meta["notes"]) == 2 and "fc.bias" in meta["notes"][0]
  tokens = jax.random.randint(jax.random.key(3), (10,), 0, target.cfg.vocab_size)
  hidden = jax.random.normal(jax.random.key(4), (10, d))
  g, _ = back(target.embed_tokens(tokens[None]), hidden[None])
  if family == "qwen2":  # the biases are the released folder's, not zeros
    assert all(tensors[f"layers.0.self_attn.{p}_proj.bias"].any() for p in "qkv")
  np.testing.assert_allclose(_vllm_eagle1_logits(folder, target, tokens, hidden),
                             np.asarray(back.logits(target, g))[0], atol=1e-4)
  config = json.loads((folder / "config.json").read_text())
  for name, change, message in [
      ("wide", {"hidden_size": 64}, "its hidden_size is 64, the policy's is 32"),
      ("deep", {"num_hidden_layers": 2}, "has 2 layers"),
      ("eagle3", None, "holds an EAGLE-3 drafter")]:
    bad = tmp_path / name
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({**config, **(change or {})}))
    save_file({**tensors, **({} if change else {"d2t": np.zeros(4, np.int64)})},
              bad / "model.safetensors")
    with pytest.raises(ValueError, match=message):
      load_any_drafter(str(bad), target)
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="an EAGLE-1 folder"):
    drafter_artifact_config(str(tmp_path / "empty"))
