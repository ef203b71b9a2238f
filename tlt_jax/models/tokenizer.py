"""Tokenizers: a real checkpoint's (`tokenizers.Tokenizer` plus its chat template), and the
character tokenizer of the built-in arithmetic task (`tasks/`), saved next to its policies."""

from __future__ import annotations

import functools
import json
import os
from typing import Sequence

import jinja2
from jinja2 import sandbox
from tokenizers import Tokenizer

from tlt_jax.paths import as_path


class TextTokenizer:
  """Encodes and decodes text and renders chat messages with the checkpoint's own template."""

  def __init__(self, tokenizer, *, bos_token: str | None, eos_token: str | None,
               chat_template: str | None, add_bos: bool = False, extra_stop_ids=()):
    self.tokenizer = tokenizer
    self.bos_token, self.eos_token = bos_token, eos_token
    self.chat_template = chat_template
    self.add_bos = add_bos
    self.bos_id = tokenizer.token_to_id(bos_token) if bos_token else None
    self.eos_id = tokenizer.token_to_id(eos_token) if eos_token else None
    self.pad_id = self.eos_id if self.eos_id is not None else 0
    self.vocab_size = tokenizer.get_vocab_size()
    # Where generation stops: eos, and every id a chat model's generation_config.json lists.
    self.stop_ids = tuple(dict.fromkeys(
        i for i in (self.eos_id, *extra_stop_ids) if i is not None))

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    """Token ids of `text`."""
    ids = self.tokenizer.encode(text, add_special_tokens=False).ids
    if add_special_tokens and self.add_bos and self.bos_id is not None:
      ids = [self.bos_id] + ids
    return ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """The text of token ids."""
    return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """Renders `messages` with the checkpoint's Jinja chat template (as `transformers` does)."""
    if not self.chat_template:
      raise ValueError("This tokenizer has no chat template (a base model): render its prompts "
                       "as plain text.")
    return _compiled_template(self.chat_template).render(
        messages=messages, add_generation_prompt=add_generation_prompt,
        bos_token=self.bos_token or "", eos_token=self.eos_token or "")

  def save(self, directory: str | os.PathLike) -> None:
    """Writes `tokenizer.json`, `tokenizer_config.json` (with the chat template) and
    `generation_config.json` with every stop id, so that the saved model stops where this one
    does wherever it is served."""
    directory = as_path(directory)
    (directory / "tokenizer.json").write_text(self.tokenizer.to_str(pretty=True))
    cfg = {"bos_token": self.bos_token, "eos_token": self.eos_token,
           "add_bos_token": self.add_bos, "tokenizer_class": "PreTrainedTokenizerFast"}
    if self.chat_template:
      cfg["chat_template"] = self.chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    if self.stop_ids:
      gen = {"eos_token_id": list(self.stop_ids)}
      if self.bos_id is not None:
        gen["bos_token_id"] = self.bos_id
      (directory / "generation_config.json").write_text(json.dumps(gen, indent=2))

  @classmethod
  def from_hf_folder(cls, directory: str) -> "TextTokenizer":
    """The tokenizer (and chat template) of a Hugging Face folder."""
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
               chat_template=template, add_bos=bool(cfg.get("add_bos_token", False)),
               extra_stop_ids=generation_stop_ids(directory))


def _raise_exception(message):
  raise jinja2.exceptions.TemplateError(message)


@functools.lru_cache(maxsize=8)
def _compiled_template(source: str) -> jinja2.Template:
  """A chat template compiled once (a dataset's thousands of prompts render with one)."""
  env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                              extensions=["jinja2.ext.loopcontrols"])
  env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
  env.globals["raise_exception"] = _raise_exception
  return env.from_string(source)


def generation_stop_ids(directory: str) -> tuple[int, ...]:
  """The `eos_token_id`s of a folder's `generation_config.json` (an int or a list; none when the
  file is absent)."""
  path = os.path.join(directory, "generation_config.json")
  if not os.path.exists(path):
    return ()
  ids = json.load(open(path)).get("eos_token_id")
  ids = [] if ids is None else ids if isinstance(ids, list) else [ids]
  return tuple(int(i) for i in ids)


PAD, BOS, EOS = 0, 1, 2
_CHARS = "0123456789+-*=;#:QA \n"


class CharTokenizer:
  """Maps each character of the task's alphabet to one id; ids 0-2 are PAD, BOS, EOS."""

  pad_id, bos_id, eos_id = PAD, BOS, EOS
  stop_ids = (EOS,)

  def __init__(self, vocab_size: int = 32):
    self.chars = _CHARS
    if vocab_size < 3 + len(self.chars):
      raise ValueError(f"vocab_size must be >= {3 + len(self.chars)}, got {vocab_size}.")
    self.vocab_size = vocab_size
    self._to_id = {c: i + 3 for i, c in enumerate(self.chars)}

  FILE = "char_tokenizer.json"

  def save(self, directory: str | os.PathLike) -> None:
    """Written next to an exported policy, so `load_pretrained(directory)` finds this tokenizer."""
    (as_path(directory) / self.FILE).write_text(
        json.dumps({"kind": "char", "vocab_size": self.vocab_size, "chars": self.chars}))

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, one per character."""
    try:
      return [self._to_id[c] for c in text]
    except KeyError as e:
      raise ValueError(f"Character {e.args[0]!r} is not in the task alphabet "
                       f"{self.chars!r}.") from e

  def decode(self, ids: Sequence[int], stop_at_eos: bool = True) -> str:
    """The text of token ids (special tokens dropped)."""
    out = []
    for i in ids:
      i = int(i)
      if i == EOS and stop_at_eos:
        break
      if i >= 3 and i - 3 < len(self.chars):
        out.append(self.chars[i - 3])
    return "".join(out)
