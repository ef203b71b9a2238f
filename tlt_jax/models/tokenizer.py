"""Text tokenizer of a real checkpoint: a `tokenizers.Tokenizer` plus its chat template."""

from __future__ import annotations

import json
import os
from typing import Sequence


class TextTokenizer:
  """Encodes and decodes text and renders chat messages with the checkpoint's own template."""

  def __init__(self, tokenizer, *, bos_token: str | None, eos_token: str | None,
               chat_template: str | None, add_bos: bool = False):
    self.tokenizer = tokenizer
    self.bos_token, self.eos_token = bos_token, eos_token
    self.chat_template = chat_template
    self.add_bos = add_bos
    self.bos_id = tokenizer.token_to_id(bos_token) if bos_token else None
    self.eos_id = tokenizer.token_to_id(eos_token) if eos_token else None
    self.pad_id = self.eos_id if self.eos_id is not None else 0
    self.vocab_size = tokenizer.get_vocab_size()

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    ids = self.tokenizer.encode(text, add_special_tokens=False).ids
    if add_special_tokens and self.add_bos and self.bos_id is not None:
      ids = [self.bos_id] + ids
    return ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """Renders `messages` with the checkpoint's Jinja chat template (as `transformers` does)."""
    if not self.chat_template:
      raise ValueError("This tokenizer has no chat template; pass --chat only for chat models.")
    import jinja2
    from jinja2 import sandbox

    def raise_exception(message):
      raise jinja2.exceptions.TemplateError(message)

    env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(self.chat_template).render(
        messages=messages, add_generation_prompt=add_generation_prompt,
        bos_token=self.bos_token or "", eos_token=self.eos_token or "")

  def save(self, directory: str) -> None:
    """Writes `tokenizer.json` and `tokenizer_config.json` (with the chat template)."""
    self.tokenizer.save(os.path.join(directory, "tokenizer.json"))
    cfg = {"bos_token": self.bos_token, "eos_token": self.eos_token,
           "add_bos_token": self.add_bos, "tokenizer_class": "PreTrainedTokenizerFast"}
    if self.chat_template:
      cfg["chat_template"] = self.chat_template
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
      json.dump(cfg, f, indent=2)

  @classmethod
  def from_hf_folder(cls, directory: str) -> "TextTokenizer":
    from tokenizers import Tokenizer
    path = os.path.join(directory, "tokenizer.json")
    if not os.path.exists(path):
      raise FileNotFoundError(f"{path} is missing: a Hugging Face checkpoint folder needs its "
                              "tokenizer.json (save it with tokenizer.save_pretrained).")
    cfg_path = os.path.join(directory, "tokenizer_config.json")
    cfg = json.load(open(cfg_path)) if os.path.exists(cfg_path) else {}
    tok = Tokenizer.from_file(path)

    def token(v):
      return v.get("content") if isinstance(v, dict) else v
    template = cfg.get("chat_template")
    jinja_path = os.path.join(directory, "chat_template.jinja")  # newer transformers save it apart
    if template is None and os.path.exists(jinja_path):
      template = open(jinja_path).read()
    return cls(tok, bos_token=token(cfg.get("bos_token")), eos_token=token(cfg.get("eos_token")),
               chat_template=template, add_bos=bool(cfg.get("add_bos_token", False)))
