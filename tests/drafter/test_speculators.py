"""An "eagle3" drafter exported in the `speculators` format is checked against the library that
defines the format, not against ourselves: speculators' own `Eagle3DraftModel` (the EAGLE-3
definition vLLM serves) loads the exported folder, and its submodules (`fc`, the midlayer, `norm`,
`lm_head`, the rotary embedding; its `forward` returns only drafted tokens) give our drafter's
next-token logits from the same target features and tokens, and the same greedy drafts at depths
1-3 mapped to target tokens through the folder's `d2t` (`experiments/benchmarks/served.py`'s
`Eagle3` drives the library's model)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from tests.conftest import small_config
from tests.drafter.test_drafter import _trained_drafter
from tests.drafter.test_serving import _perturbed
from tests.spec.test_spec_engine import _prompts, peaked_model
from tlt_jax.drafter.model import DrafterConfig, drafter_cache, init_drafter
from tlt_jax.drafter.serving import export_drafter
from tlt_jax.drafter.warmup import drafter_artifact_config, load_any_drafter
from tlt_jax.models import init_model
from tlt_jax.models import kv_cache as kvc
from tlt_jax.models.pretrained import save_pretrained

T = 10  # positions fed before drafting

# torch, speculators (~5 s to import) and experiments.benchmarks.served (which imports torch) are
# imported by the tests that use them: a pytest worker that collects this file without running it
# does not pay for them.


def _pair(family):
  target = init_model(small_config(rope_layout="interleaved", family=family, n_layers=3), seed=0)
  ids = tuple(int(i) for i in np.sort(np.random.default_rng(0).choice(53, 24, replace=False)))
  cfg = DrafterConfig(architecture="eagle3", feature_layers=(0, 1, 2), draft_vocab=24,
                      vocab_ids=ids)
  return target, _perturbed(init_drafter(target.cfg, cfg, seed=1), 2)


# On CPU flex attention runs its unfused reference (the warning says so): exact, and small here.
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_speculators_loads_an_exported_eagle3_drafter_with_our_logits_and_drafts(tmp_path, family):
  import torch
  from experiments.benchmarks.served import Eagle3
  target, drafter = _pair(family)
  save_pretrained(target, None, tmp_path / "policy")  # the verifier the library reads
  folder = tmp_path / "drafter"
  assert export_drafter(drafter, folder, target=target, verifier=str(tmp_path / "policy")) == []
  library = Eagle3.load(folder)
  tokens = jax.random.randint(jax.random.key(3), (T,), 0, 53)
  feats = jax.random.normal(jax.random.key(4), (T, 3 * target.cfg.d_model))
  g, _ = drafter(target.embed_tokens(tokens[None]), drafter.project(feats[None]))
  ours = np.asarray(drafter.logits(target, g))[0]
  theirs = library.logits(torch.from_numpy(np.array(tokens)), torch.from_numpy(np.array(feats)))
  np.testing.assert_allclose(theirs.numpy(), ours, atol=1e-4, rtol=0)
  assert np.abs(ours).max() > 0.1  # the logits are not all near zero

  # Greedy drafts at depths 1-3 after the T pairs: ours through the drafter's cache.
  cache = drafter_cache(target.cfg, 1, 32)
  g, cache = drafter(target.embed_tokens(tokens[None]), drafter.project(feats[None]), cache)
  cache = kvc.commit(cache, jnp.array([T]))
  ours_drafts, h = [], g[:, -1:]
  for _ in range(3):
    tok = drafter.token_ids(jnp.argmax(drafter.logits(target, h)[0, -1]))
    ours_drafts.append(int(tok))
    h, cache = drafter(target.embed_tokens(tok.reshape(1, 1)), h, cache)
    cache = kvc.commit(cache, jnp.array([1]))
  theirs_drafts = library.draft(torch.from_numpy(np.array(tokens)),
                                torch.from_numpy(np.array(feats)), 3)
  assert theirs_drafts == ours_drafts
  assert all(t in drafter.cfg.vocab_ids for t in ours_drafts)


def _library_saved(tmp_path, target):
  """An EAGLE-3 drafter made and saved by speculators itself, as its training does: a Llama
  midlayer, a 24-token draft vocabulary mapped by t2d / d2t, its embedding and head loaded from
  the verifier folder, every other weight random (norms moved off 1)."""
  import torch
  from speculators.models.eagle3 import Eagle3SpeculatorConfig
  from speculators.models.eagle3.core import Eagle3DraftModel
  verifier = tmp_path / "policy"
  save_pretrained(target, None, verifier)
  export_drafter(_pair("llama")[1], tmp_path / "ours", target=target, verifier=str(verifier))
  config = json.loads((tmp_path / "ours" / "config.json").read_text())
  config.pop("tlt_jax")
  model = Eagle3DraftModel(Eagle3SpeculatorConfig.model_validate(config))
  ids = torch.tensor(sorted(np.random.default_rng(5).choice(53, 24, replace=False).tolist()))
  t2d = torch.zeros(53, dtype=torch.bool)
  t2d[ids] = True
  model.load_vocab_mappings(t2d, ids - torch.arange(24))
  model.load_verifier_weights()
  torch.manual_seed(0)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.add_(0.3 * torch.randn_like(p))
  model.save_pretrained(str(tmp_path / "released"))
  return model, tmp_path / "released"


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_a_drafter_saved_by_speculators_imports_with_the_library_s_logits(tmp_path):
  import torch
  from experiments.benchmarks.served import Eagle3
  target, ours = _pair("llama")
  model, folder = _library_saved(tmp_path, target)
  drafter, meta = load_any_drafter(str(folder), target)
  assert meta == {"notes": []}  # its head rows and embedding are the policy's
  assert drafter.cfg == drafter_artifact_config(str(folder))
  assert drafter.cfg.vocab_ids == tuple(int(i) for i in torch.nonzero(model.t2d)[:, 0])
  tokens = jax.random.randint(jax.random.key(3), (T,), 0, 53)
  feats = jax.random.normal(jax.random.key(4), (T, 3 * target.cfg.d_model))
  g, _ = drafter(target.embed_tokens(tokens[None]), drafter.project(feats[None]))
  theirs = Eagle3(model).logits(torch.from_numpy(np.array(tokens)),
                                torch.from_numpy(np.array(feats)))
  np.testing.assert_allclose(theirs.numpy(), np.asarray(drafter.logits(target, g))[0],
                             atol=1e-4, rtol=0)


def test_our_export_imports_back_bit_for_bit_and_bad_folders_are_one_line(tmp_path):
  target, drafter = _pair("llama")
  export_drafter(drafter, tmp_path / "ours", target=target)
  back, meta = load_any_drafter(str(tmp_path / "ours"), target)
  assert meta == {"notes": []} and back.cfg == drafter.cfg
  for a, b in zip(jax.tree.leaves(nnx.state(back, nnx.Param)),
                  jax.tree.leaves(nnx.state(drafter, nnx.Param))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  config = json.loads((tmp_path / "ours" / "config.json").read_text())
  tensors = load_file(tmp_path / "ours" / "model.safetensors")
  layer = config["transformer_layer_config"]
  for name, change, message in [
      ("wide", {"transformer_layer_config": {**layer, "hidden_size": 64}},
       "its hidden_size is 64, the policy's is 32"),
      ("deep_target", {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
       r"target layers \[1, 2, 3\]; the policy has 3 layers"),
      ("mtp", {"speculators_model_type": "mtp"}, "only EAGLE-3 is imported"),
      ("eagle31", {"norm_output": True}, "sets norm_output"),
      ("no_layers", {"eagle_aux_hidden_state_layer_ids": None}, "names no eagle_aux")]:
    bad = tmp_path / name
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({**config, **change}))
    save_file(tensors, bad / "model.safetensors")
    with pytest.raises(ValueError, match=message):
      load_any_drafter(str(bad), target)
  with pytest.raises(ValueError, match="exports as --format=eagle"):
    export_drafter(init_drafter(target.cfg, DrafterConfig()), tmp_path / "x", "speculators",
                   target=target)


@pytest.mark.slow  # the serving side end to end: policy and drafter exported, run in PyTorch
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("architecture", ["eagle3", "eagle"])
def test_a_pytorch_loop_with_the_exported_drafter_accepts_what_our_engine_accepts(tmp_path,
                                                                                  architecture):
  """The serving side end to end, without vLLM: greedy chain of 3 in PyTorch (transformers'
  Llama from the exported policy; speculators' model of an exported "eagle3" drafter, the
  vLLM-derived EAGLE-1 forward of an "eagle" one) against our engine's SD with the drafter on 8
  prompts: the same accepted tokens per step within 0.05; the folder imported back accepts in
  our engine exactly what the drafter does."""
  from experiments.benchmarks.served import served_acceptance
  target = peaked_model(n_layers=3)
  layers = (0, 1, 2) if architecture == "eagle3" else ()
  drafter = _trained_drafter(target, layers, architecture=architecture)[0]
  out = served_acceptance(target, drafter, _prompts(8, seed=4), 24, str(tmp_path))
  assert out["notes"] == [] and out["ours"] > 1.3, out
  assert out["served_in_our_engine"] == out["ours"], out
  assert abs(out["pytorch_minus_engine"]) <= 0.05, out
