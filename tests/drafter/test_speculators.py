"""An "eagle3" drafter exported in the `speculators` format is checked against the library that
defines the format, not against ourselves: speculators' own `Eagle3DraftModel` (the EAGLE-3
definition vLLM serves) loads the exported folder, and its submodules (`fc`, the midlayer, `norm`,
`lm_head`, the rotary embedding; its `forward` returns only drafted tokens) give our drafter's
next-token logits from the same target features and tokens, and the same greedy drafts at depths
1-3 mapped to target tokens through the folder's `d2t`."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from torch.nn.attention.flex_attention import create_block_mask
from flax import nnx
from safetensors.numpy import load_file, save_file
from speculators.models.eagle3 import Eagle3SpeculatorConfig
from speculators.models.eagle3.core import Eagle3DraftModel

from tests.conftest import small_config
from tests.drafter.test_drafter import _run, _trained_drafter
from tests.drafter.test_serving import _perturbed
from tests.spec.test_spec_engine import _prompts, peaked_model
from tlt_jax.drafter.model import DrafterConfig, drafter_cache, init_drafter
from tlt_jax.drafter.serving import export_drafter
from tlt_jax.drafter.warmup import drafter_artifact_config, load_any_drafter
from tlt_jax.models import init_model
from tlt_jax.models import kv_cache as kvc
from tlt_jax.models.pretrained import save_pretrained
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.spec.strategy import SpecConfig, Strategy

T = 10  # positions fed before drafting


def _pair(family):
  target = init_model(small_config(rope_layout="interleaved", family=family, n_layers=3), seed=0)
  ids = tuple(int(i) for i in np.sort(np.random.default_rng(0).choice(53, 24, replace=False)))
  cfg = DrafterConfig(architecture="eagle3", feature_layers=(0, 1, 2), draft_vocab=24,
                      vocab_ids=ids)
  return target, _perturbed(init_drafter(target.cfg, cfg, seed=1), 2)


def _library_model(folder):
  return Eagle3DraftModel.from_pretrained(str(folder)).eval()


def _library_logits(model, tokens_T, feats_TxF, drafts=()):
  """The library's midlayer over the (token, feature) pairs of one sequence, then a draft step
  for each of `drafts`, each a (drafted token, the step before's output) pair as speculators'
  forward feeds it; logits over the draft vocabulary at every position."""

  def midlayer(toks, hidden):
    x = torch.cat([model.embed_tokens(toks), hidden], -1)
    n = x.shape[1]
    pos = torch.arange(n)[None]
    mask = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, n, n, device="cpu")
    return model.layers[0](x, attention_mask=mask, position_ids=pos,
                           position_embeddings=model.rotary_emb(x, pos))

  with torch.no_grad():
    toks, hidden = tokens_T[None], model.fc(feats_TxF[None])
    out = midlayer(toks, hidden)
    for tok in drafts:
      toks, hidden = torch.cat([toks, tok.view(1, 1)], 1), torch.cat([hidden, out[:, -1:]], 1)
      out = midlayer(toks, hidden)
    return model.lm_head(model.norm(out))[0]


# On CPU flex attention runs its unfused reference (the warning says so): exact, and small here.
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_speculators_loads_an_exported_eagle3_drafter_with_our_logits_and_drafts(tmp_path, family):
  target, drafter = _pair(family)
  save_pretrained(target, None, tmp_path / "policy")  # the verifier the library reads
  folder = tmp_path / "drafter"
  assert export_drafter(drafter, folder, target=target, verifier=str(tmp_path / "policy")) == []
  model = _library_model(folder)
  tokens = jax.random.randint(jax.random.key(3), (T,), 0, 53)
  feats = jax.random.normal(jax.random.key(4), (T, 3 * target.cfg.d_model))
  g, _ = drafter(target.embed_tokens(tokens[None]), drafter.project(feats[None]))
  ours = np.asarray(drafter.logits(target, g))[0]
  theirs = _library_logits(model, torch.from_numpy(np.array(tokens)),
                              torch.from_numpy(np.array(feats)))
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
  d2t = model.d2t
  theirs_drafts = []
  for _ in range(3):
    logits = _library_logits(model, torch.from_numpy(np.array(tokens)),
                                torch.from_numpy(np.array(feats)),
                                [torch.tensor(t) for t in theirs_drafts])
    d = int(logits[-1].argmax())
    theirs_drafts.append(d + int(d2t[d]))
  assert theirs_drafts == ours_drafts
  assert all(t in drafter.cfg.vocab_ids for t in ours_drafts)


def _library_saved(tmp_path, target):
  """An EAGLE-3 drafter made and saved by speculators itself, as its training does: a Llama
  midlayer, a 24-token draft vocabulary mapped by t2d / d2t, its embedding and head loaded from
  the verifier folder, every other weight random (norms moved off 1)."""
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
  target, ours = _pair("llama")
  model, folder = _library_saved(tmp_path, target)
  drafter, meta = load_any_drafter(str(folder), target)
  assert meta == {"notes": []}  # its head rows and embedding are the policy's
  assert drafter.cfg == drafter_artifact_config(str(folder))
  assert drafter.cfg.vocab_ids == tuple(int(i) for i in torch.nonzero(model.t2d)[:, 0])
  tokens = jax.random.randint(jax.random.key(3), (T,), 0, 53)
  feats = jax.random.normal(jax.random.key(4), (T, 3 * target.cfg.d_model))
  g, _ = drafter(target.embed_tokens(tokens[None]), drafter.project(feats[None]))
  theirs = _library_logits(model, torch.from_numpy(np.array(tokens)),
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


def _torch_accept_len(target_hf, model, prompts, layers, n_new: int, depth: int = 3) -> float:
  """Greedy chain speculative decoding in PyTorch alone: Hugging Face's model of the policy as
  the target, speculators' model of the exported drafter drafting `depth` tokens from the
  target's fused layer inputs (`output_hidden_states`: entry k is layer k's input), the target
  verifying them; the mean tokens emitted per step (the next token and the drafts it accepts)."""
  emitted = []
  with torch.no_grad():
    for prompt in prompts:
      seq, new = torch.tensor(prompt), 0
      while new < n_new:
        out = target_hf(seq[None], output_hidden_states=True)
        nxt = out.logits[0, -1].argmax()
        feats = torch.cat([out.hidden_states[k][0] for k in layers], -1)
        drafts = []
        for _ in range(depth):
          logits = _library_logits(model, torch.cat([seq[1:], nxt.view(1)]), feats,
                                   [torch.tensor(t) for t in drafts])
          d = int(logits[-1].argmax())
          drafts.append(d + (0 if model.d2t is None else int(model.d2t[d])))  # None: full vocab
        cand = torch.cat([seq, nxt.view(1), torch.tensor(drafts)])
        preds = target_hf(cand[None]).logits[0, len(seq):len(seq) + depth].argmax(-1)
        ok = 0
        while ok < depth and drafts[ok] == int(preds[ok]):
          ok += 1
        keep = min(1 + ok, n_new - new)
        emitted.append(keep)
        seq, new = cand[:len(seq) + keep], new + keep
  return float(np.mean(emitted))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_a_pytorch_loop_with_the_exported_drafter_accepts_what_our_engine_accepts(tmp_path):
  """The serving side end to end, without vLLM: greedy chain of 3 in PyTorch (transformers'
  Llama from the exported policy, speculators' model from the exported drafter) against our
  engine's SD with the same drafter on 8 prompts: the same accepted tokens per step within 0.05."""
  target = peaked_model(n_layers=3)
  drafter = _trained_drafter(target, (0, 1, 2), architecture="eagle3")[0]
  save_pretrained(target, None, tmp_path / "policy")
  export_drafter(drafter, tmp_path / "drafter", target=target, verifier=str(tmp_path / "policy"))
  params = SamplingParams(temperature=0.0, max_new_tokens=24)
  prompts = _prompts(8, seed=4)
  _, eng = _run(target, params, prompts, 1,
                SpecConfig(threshold=16, arms=(Strategy("eagle", depth=3),), min_accept_len=0.0),
                drafter)
  ours = eng.spec.accept_len()
  target_hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "policy")).eval()
  theirs = _torch_accept_len(target_hf, _library_model(tmp_path / "drafter"), prompts, (0, 1, 2),
                             params.max_new_tokens)
  assert ours > 1.3 and abs(theirs - ours) <= 0.05, (ours, theirs)
