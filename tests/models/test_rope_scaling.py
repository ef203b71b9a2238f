"""Llama 3.1's RoPE scaling (`rope_type: llama3`) read from a config.json in both styles, as the
hub carries it (`rope_scaling` + `rope_theta`) and as transformers 5 writes it
(`rope_parameters`), against transformers on a tiny random checkpoint; any other scaling type is
one line naming it."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models.test_pretrained import _hf_tokenizer
from tlt_jax.errors import ConfigError
from tlt_jax.models.pretrained import load_pretrained, save_pretrained
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rollout.plain import generate_plain

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 16}


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
  """A tiny Llama whose head dimension (32) spans short, medium and long wavelengths against an
  original context of 16 positions, so every branch of the scaling is exercised."""
  directory = str(tmp_path_factory.mktemp("llama3"))
  torch.manual_seed(0)
  cfg = transformers.LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=112,
                                 num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                 max_position_embeddings=256, rms_norm_eps=1e-6,
                                 tie_word_embeddings=True, rope_theta=10000.0,
                                 rope_scaling=dict(SCALING))
  model = transformers.LlamaForCausalLM(cfg).float().eval()
  model.save_pretrained(directory, safe_serialization=True)
  _hf_tokenizer(directory)
  return directory, model


def _with_config(directory, tmp_path, name, edit):
  """A copy of the checkpoint folder whose config.json `edit` rewrites."""
  out = tmp_path / name
  os.makedirs(out)
  for f in os.listdir(directory):
    data = open(os.path.join(directory, f), "rb").read()
    (out / f).write_bytes(data)
  cfg = json.loads((out / "config.json").read_text())
  cfg.pop("rope_scaling", None), cfg.pop("rope_parameters", None)
  edit(cfg)
  (out / "config.json").write_text(json.dumps(cfg))
  return str(out)


def test_llama3_scaling_in_both_config_styles_matches_transformers(llama3, tmp_path):
  directory, hf_model = llama3
  hub = lambda c: c.update(rope_scaling=dict(SCALING), rope_theta=10000.0)
  tf5 = lambda c: c.update(rope_parameters=dict(SCALING, rope_theta=10000.0))
  plain = lambda c: c.update(rope_theta=10000.0)
  ids = np.arange(3, 123)[None]  # 120 positions: past the original context many times
  with torch.no_grad():
    want = hf_model(torch.tensor(ids)).logits.numpy()
    hf_tokens = hf_model.generate(torch.tensor(ids[:, :40]), max_new_tokens=12, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)[0, 40:].tolist()
  for name, edit in (("hub", hub), ("tf5", tf5)):
    model, _ = load_pretrained(_with_config(directory, tmp_path, name, edit))
    assert model.cfg.llama3_rope == (8.0, 1.0, 4.0, 16)
    got = np.asarray(model(jnp.asarray(ids)).logits_BxTxV)
    np.testing.assert_allclose(got, want, atol=1e-4)
    ours = generate_plain(model, [ids[0, :40].tolist()], jax.random.key(0),
                          SamplingParams(temperature=0.0, max_new_tokens=12)).response(0)
    assert ours == hf_tokens
  unscaled, _ = load_pretrained(_with_config(directory, tmp_path, "plain", plain))
  assert np.abs(np.asarray(unscaled(jnp.asarray(ids)).logits_BxTxV) - want).max() > 1e-3
  # Saved back, the scaling travels (transformers reads it the same).
  model, tok = load_pretrained(_with_config(directory, tmp_path, "again", hub))
  save_pretrained(model, tok, str(tmp_path / "saved"))
  again = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path / "saved")).float().eval()
  with torch.no_grad():
    np.testing.assert_allclose(again(torch.tensor(ids)).logits.numpy(), want, atol=1e-4)


def test_another_scaling_type_is_one_line(llama3, tmp_path):
  directory, _ = llama3
  yarn = lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0})
  with pytest.raises(ConfigError, match="RoPE scaling of type 'yarn' is not supported"):
    load_pretrained(_with_config(directory, tmp_path, "yarn", yarn))
