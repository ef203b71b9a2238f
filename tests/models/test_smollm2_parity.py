"""SmolLM2-135M-Instruct from its GGUF against `transformers` loading the same file (slow)."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.conftest import jit_forward  # noqa: E402
from tlt_jax.models.pretrained import load_pretrained, smollm2_gguf_path  # noqa: E402
from tlt_jax.models.sampling import SamplingParams  # noqa: E402
from tlt_jax.rollout.plain import generate_plain  # noqa: E402

pytestmark = pytest.mark.slow

PROMPTS = ["What is the capital of France?",
           "Tom has 12 apples and gives away 5. How many are left?",
           "Write a haiku about the sea.", "Explain gravity in one sentence."]


def test_tokens_chat_template_logits_and_greedy_tokens_match_transformers():
  """One test: transformers' model from the GGUF takes 41 s to load (a module fixture shared by
  two tests was built once on each pytest worker)."""
  path = smollm2_gguf_path()
  kw = dict(gguf_file=os.path.basename(path))
  hf = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path), dtype=torch.float32,
                                                         **kw).eval()
  hf_tok = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), **kw)
  model, tok = load_pretrained("smollm2")
  _tokenizer_and_chat_template_match(hf_tok, tok)
  _logits_within_tolerance_and_greedy_32_tokens_identical(hf, model, tok)


def _tokenizer_and_chat_template_match(hf_tok, tok):
  from tokenizers import Tokenizer, pre_tokenizers
  texts = PROMPTS + ["12,345.67 x\n\ty", "Émile ça va? 日本語 <|im_end|>", "a  12 b"]
  # SmolLM2's own tokenizer.json splits digits one by one before byte-level BPE (llama.cpp's
  # `smollm` pre-tokenizer); transformers' GGUF converter omits that split, which only changes ids
  # where a run of spaces precedes a digit. Ours follows the model's own tokenizer everywhere...
  reference = Tokenizer.from_str(hf_tok.backend_tokenizer.to_str())
  reference.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Digits(individual_digits=True),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
  for text in texts:
    assert tok.encode(text) == reference.encode(text, add_special_tokens=False).ids, text
  # ...and equals transformers' GGUF tokenizer wherever no space run precedes a digit.
  for text in texts[:-1]:
    assert tok.encode(text) == hf_tok.encode(text, add_special_tokens=True), text
  for p in PROMPTS:
    msgs = [{"role": "user", "content": p}]
    assert tok.apply_chat_template(msgs) == hf_tok.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True)


def _logits_within_tolerance_and_greedy_32_tokens_identical(hf, model, tok):
  """Each prompt's logits against transformers' and its 32 greedy tokens against transformers'
  `generate`. Ours run the four prompts as one right-padded batch (one program for the forward,
  one for decoding; a causal row's positions before its padding see none of it)."""
  prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]))
             for p in PROMPTS]
  width = max(len(ids) for ids in prompts)
  padded = np.asarray([ids + [tok.pad_id] * (width - len(ids)) for ids in prompts])
  logits = np.asarray(jit_forward(model, jnp.asarray(padded)).logits_BxTxV)
  ours = generate_plain(model, prompts, jax.random.key(0),
                        SamplingParams(temperature=0.0, max_new_tokens=32), pad_id=tok.pad_id)
  for i, (p, ids) in enumerate(zip(PROMPTS, prompts)):
    with torch.no_grad():
      want = hf(torch.tensor([ids])).logits.numpy()[0]
      x = torch.tensor([ids])  # explicit mask: the prompt holds <|im_end|>, which is also the pad
      hf_gen = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=32,
                           do_sample=False, eos_token_id=None,
                           pad_token_id=tok.pad_id)[0, len(ids):].tolist()
    got = logits[i, :len(ids)]
    assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max(), p
    assert ours.response(i) == hf_gen, (p, tok.decode(ours.response(i)), tok.decode(hf_gen))
