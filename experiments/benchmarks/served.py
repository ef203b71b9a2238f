"""The drafter as the serving side runs it, without tlt_jax: greedy chain speculative decoding in
PyTorch alone (`torch_accept_len`), Hugging Face's model of the exported policy as the target and
the exported drafter read from its folder as vLLM reads it: EAGLE-1 by a forward written from
vLLM's `model_executor/models/llama_eagle.py` (`Eagle1`: `fc` over [token embedding, target
hidden] without a bias, decoder layer 0 without its input norm, no output norm, the target's head
on the layer's output; Hugging Face's rotate-half RoPE), EAGLE-3 by the `speculators` library's own
model (`Eagle3`). `served_acceptance` sets that loop's tokens per step beside our engine's, with
the drafter itself and with its exported folder imported back (what vLLM computes, in our engine).

torch, transformers and speculators come with the test extra (`make test` installs them); this
module imports torch and is imported only where they are.
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import torch
from safetensors.numpy import load_file

from tlt_jax.drafter.proposer import EagleProposer
from tlt_jax.drafter.serving import default_format, export_drafter
from tlt_jax.drafter.warmup import load_any_drafter
from tlt_jax.models.pretrained import save_pretrained
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.spec.strategy import SpecConfig, Strategy


def _rms(x, w, eps):
  return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_half(x_TxHxE, theta):
  """Hugging Face's rotate-half rotary embedding at positions 0..T-1."""
  t, _, e = x_TxHxE.shape
  inv = 1.0 / theta ** (torch.arange(0, e, 2, dtype=torch.float64) / e)
  ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None]
  cos = torch.cat([ang.cos(), ang.cos()], -1).float()[:, None]
  sin = torch.cat([ang.sin(), ang.sin()], -1).float()[:, None]
  rotated = torch.cat([-x_TxHxE[..., e // 2:], x_TxHxE[..., : e // 2]], -1)
  return x_TxHxE * cos + rotated * sin


class Eagle1:
  """vLLM's EAGLE-1 drafter of an exported folder, over the target's embedding `[V, D]` and head
  `[V, D]` (torch tensors)."""

  features = "final"  # the target's last (post-norm) hidden state

  def __init__(self, folder, embed_VxD, head_VxD):
    with open(os.path.join(folder, "config.json")) as f:
      self.c = json.load(f)
    self.w = {k: torch.from_numpy(v) for k, v in
              load_file(os.path.join(folder, "model.safetensors")).items()}
    self.embed, self.head = embed_VxD, head_VxD

  def _lin(self, x, name):
    w, b = self.w[f"layers.0.{name}.weight"], self.w.get(f"layers.0.{name}.bias")
    return x @ w.T + (0 if b is None else b)

  def forward(self, tokens_T, hidden_TxD):
    """Logits `[T, V]` and the layer's output `[T, D]` (a deeper step's hidden) over one
    sequence: position t reads the token after t and the target's hidden state at t."""
    c = self.c
    x = torch.cat([self.embed[tokens_T], hidden_TxD], -1) @ self.w["fc.weight"].T  # no fc bias
    t, h, kv, e = len(tokens_T), c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    q = rope_half(self._lin(x, "self_attn.q_proj").view(t, h, e), c["rope_theta"])  # no norm
    k = rope_half(self._lin(x, "self_attn.k_proj").view(t, kv, e), c["rope_theta"])
    v = self._lin(x, "self_attn.v_proj").view(t, kv, e)
    k, v = k.repeat_interleave(h // kv, 1), v.repeat_interleave(h // kv, 1)
    scores = torch.einsum("qhe,khe->hqk", q, k) / e ** 0.5
    scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    attn = torch.einsum("hqk,khe->qhe", scores.softmax(-1), v).reshape(t, h * e)
    x = x + self._lin(attn, "self_attn.o_proj")
    m = _rms(x, self.w["layers.0.post_attention_layernorm.weight"], c["rms_norm_eps"])
    x = x + self._lin(torch.nn.functional.silu(self._lin(m, "mlp.gate_proj"))
                      * self._lin(m, "mlp.up_proj"), "mlp.down_proj")
    return x @ self.head.T, x  # no output norm

  def draft(self, tokens_T, feats_TxF, depth: int) -> list[int]:
    """`depth` greedy drafts after the sequence, each step reading the last draft and the
    drafter's own output before it."""
    drafts, toks, hidden = [], tokens_T, feats_TxF
    for _ in range(depth):
      logits, out = self.forward(toks, hidden)
      drafts.append(int(logits[-1].argmax()))
      toks = torch.cat([toks, torch.tensor(drafts[-1:])])
      hidden = torch.cat([hidden, out[-1:]])
    return drafts


class Eagle3:
  """speculators' EAGLE-3 model of an exported folder (its `Eagle3DraftModel`): its submodules
  (`fc`, the midlayer, `norm`, `lm_head`, the rotary embedding), as its `forward` returns only
  drafted tokens."""

  def __init__(self, model, feature_layers=()):
    self.model, self.features = model, tuple(feature_layers)

  @classmethod
  def load(cls, folder, feature_layers=()):
    from speculators.models.eagle3.core import Eagle3DraftModel  # the test extra's
    return cls(Eagle3DraftModel.from_pretrained(str(folder)).eval(), feature_layers)

  def logits(self, tokens_T, feats_TxF, drafts=()):
    """The midlayer over the (token, feature) pairs of one sequence, then a draft step for each
    of `drafts` (target token ids), each fed the step before's output as speculators' forward
    feeds it; logits over the draft vocabulary at every position."""
    from torch.nn.attention.flex_attention import create_block_mask
    model = self.model

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
        toks = torch.cat([toks, torch.tensor(tok).view(1, 1)], 1)
        hidden = torch.cat([hidden, out[:, -1:]], 1)
        out = midlayer(toks, hidden)
      return model.lm_head(model.norm(out))[0]

  def draft(self, tokens_T, feats_TxF, depth: int) -> list[int]:
    drafts = []
    for _ in range(depth):
      d = int(self.logits(tokens_T, feats_TxF, drafts)[-1].argmax())
      drafts.append(d + (0 if self.model.d2t is None else int(self.model.d2t[d])))  # full vocab
    return drafts


def _features(out, features):
  """The drafter's features from Hugging Face's outputs: the last hidden state (post-norm), or
  layers' inputs concatenated (`hidden_states[k]`: layer k's input)."""
  if features == "final":
    return out.hidden_states[-1][0]
  return torch.cat([out.hidden_states[k][0] for k in features], -1)


def torch_accept_len(target_hf, drafter, prompts, n_new: int, depth: int = 3,
                     stop_ids=()) -> float:
  """Greedy chain speculative decoding in PyTorch alone, as a server runs it: `target_hf` (Hugging
  Face, with its KV cache) verifies `depth` drafts of `drafter` (`Eagle1` or `Eagle3`) per step
  in one forward over the step's token and its drafts, and its cache keeps the accepted ones; the
  mean tokens emitted per step (the target's next token and the drafts it accepts), each row
  ending at `n_new` tokens or a stop token."""
  import transformers  # the test extra's
  emitted = []
  with torch.no_grad():
    for prompt in prompts:
      seq, new, done = torch.tensor(prompt), 0, False
      cache = transformers.DynamicCache()
      out = target_hf(seq[None], past_key_values=cache, use_cache=True, output_hidden_states=True)
      feats, nxt = _features(out, drafter.features), out.logits[0, -1].argmax()
      while new < n_new and not done:
        drafts = drafter.draft(torch.cat([seq[1:], nxt.view(1)]), feats, depth)
        step = torch.cat([nxt.view(1), torch.tensor(drafts)])
        out = target_hf(step[None], past_key_values=cache, use_cache=True,
                        output_hidden_states=True)
        preds = out.logits[0].argmax(-1)  # the target's token after each of the step's
        ok = 0
        while ok < depth and drafts[ok] == int(preds[ok]):
          ok += 1
        kept = step[:min(1 + ok, n_new - new)].tolist()
        stop = next((i for i, t in enumerate(kept) if t in stop_ids), None)
        if stop is not None:
          kept, done = kept[:stop + 1], True
        emitted.append(len(kept))
        if len(kept) < len(step):  # the rejected drafts' keys and values go
          cache.crop(len(kept) - len(step))
        feats = torch.cat([feats, _features(out, drafter.features)[:len(kept)]])
        seq, new, nxt = torch.cat([seq, torch.tensor(kept)]), new + len(kept), preds[len(kept) - 1]
  return float(np.mean(emitted))


def engine_accept_len(model, drafter, prompts, params: SamplingParams, depth: int,
                      pad_id: int = 0) -> tuple[float, list[list[int]]]:
  """Our engine's tokens per speculative step with `drafter` (a chain of `depth` at every step),
  and the completions."""
  cfg = EngineConfig(batch_buckets=(len(prompts),), max_batch=len(prompts), precompile=False,
                     prefill_buckets=(max(16, *map(len, prompts)),))
  spec = SpecConfig(threshold=len(prompts), arms=(Strategy("eagle", depth=depth),),
                    min_accept_len=0.0)
  engine = RolloutEngine(model, cfg, pad_id=pad_id, spec=spec, drafter=EagleProposer(drafter))
  res = engine.generate(prompts, 1, params, jax.random.key(0))
  return engine.spec.accept_len(), [res.response(i) for i in range(len(prompts))]


def served_acceptance(model, drafter, prompts, max_new_tokens: int, out_dir: str, depth: int = 3,
                      tokenizer=None) -> dict:
  """Greedy chains of `depth` on `prompts` (token ids; rows end at a stop token of `tokenizer`,
  if given, or at `max_new_tokens`): tokens per step of our engine with `drafter`, of our engine
  with its export (written under `out_dir`, beside the policy's) imported back as the serving side
  reads it, and of the PyTorch loop over the two exported folders; what the served drafter does
  otherwise (`notes`, the export's lines)."""
  import transformers  # the test extra's
  policy_dir, drafter_dir = (os.path.join(out_dir, n) for n in ("policy", "drafter"))
  save_pretrained(model, tokenizer, policy_dir)
  notes = export_drafter(drafter, drafter_dir, target=model, verifier=policy_dir)
  stop_ids = tuple(tokenizer.stop_ids) if tokenizer is not None else ()
  pad_id = tokenizer.pad_id if tokenizer is not None else 0
  params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, stop_tokens=stop_ids)
  ours, _ = engine_accept_len(model, drafter, prompts, params, depth, pad_id)
  served, _ = load_any_drafter(drafter_dir, model)
  imported, _ = engine_accept_len(model, served, prompts, params, depth, pad_id)
  target_hf = transformers.AutoModelForCausalLM.from_pretrained(
      policy_dir, dtype=torch.float32).eval()
  if default_format(drafter) == "speculators":
    reference = Eagle3.load(drafter_dir, drafter.cfg.feature_layers)
  else:
    reference = Eagle1(drafter_dir, target_hf.get_input_embeddings().weight.detach(),
                       target_hf.get_output_embeddings().weight.detach())
  torch_len = torch_accept_len(target_hf, reference, prompts, max_new_tokens, depth,
                               set(stop_ids))
  return {"ours": round(ours, 3), "served_in_our_engine": round(imported, 3),
          "served_in_pytorch": round(torch_len, 3),
          "pytorch_minus_engine": round(torch_len - imported, 3), "notes": notes,
          "format": default_format(drafter), "architecture": drafter.cfg.architecture,
          "rows": len(prompts), "depth": depth, "max_new_tokens": max_new_tokens}
