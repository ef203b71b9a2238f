"""`StoredResponses`: each prompt-addressed sample's response at its last visit, for replay and
drafting; `PromptMemory`, what a run keeps per prompt across steps; `ReplayConfig`, their
settings.

A sample is addressed by its prompt (`rollout/noise.py`): (prompt id, occurrence in the step,
index in the group), with the noise epoch it was drawn under. Under the same address and epoch a
later step draws the same noise, so its stored response is what the policy of that visit sampled
under the noise the current policy will see: the replay arm re-verifies it
(`rollout.history.chunk`), and the suffix proposer drafts from a prompt's stored responses.

The store is bounded (`max_tokens`; the least recently visited samples go first), the same on
every process (it is filled from the gathered rollout), and travels in checkpoints as flat arrays.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from tlt_jax.rollout.noise import NOISE_MODES, PromptNoise
from tlt_jax.rollout.replay_choice import DISPATCH_MODES
from tlt_jax.typed import typed

_KEY_WORDS = (0, 1, 3, 4)  # the address words that name a sample (all but the noise epoch)
_EPOCH_WORD = 2


@dataclasses.dataclass(frozen=True)
class HistoryConfig:
  """`rollout.history`: the store's bound in tokens (`max_tokens`, 0: no store), the stored
  tokens verified per replay step (`chunk`, 0: no replay) and how a dispatch chooses to replay
  (`dispatch`, `rollout/replay_choice.py`): "cost", priced by the cost table measured at start-up,
  or "share", while at least half of its live rows replay (nothing measured)."""

  max_tokens: int = 0      # the store's bound in tokens (0: no store)
  chunk: int = 0           # stored tokens verified per replay step (0: no replay)
  dispatch: str = "cost"   # cost (priced by the cost table) | share (half the live rows replay)

  def __post_init__(self):
    if min(self.max_tokens, self.chunk) < 0:
      raise ValueError("history.max_tokens and history.chunk must be >= 0 (0: off).")
    if self.dispatch not in DISPATCH_MODES:
      raise ValueError(f"history.dispatch must be one of {DISPATCH_MODES}, got "
                       f"{self.dispatch!r}.")
    if self.chunk and not self.max_tokens:
      raise ValueError("history.chunk > 0 replays stored responses: set history.max_tokens > 0 "
                       "(the store's bound).")


@dataclasses.dataclass(frozen=True)
class ReplayConfig:
  """How a run addresses its noise and reuses earlier responses (the `rollout` section's
  `noise`, `noise_refresh` and `history`): `noise` "step" or "prompt" (`rollout/noise.py`),
  `noise_refresh` visits per noise epoch (0: never renewed)."""

  noise: str = "step"
  noise_refresh: int = 0
  history: HistoryConfig = HistoryConfig()

  def __post_init__(self):
    if self.noise not in NOISE_MODES:
      raise ValueError(f"noise must be one of {NOISE_MODES}, got {self.noise!r}.")
    if self.noise_refresh < 0:
      raise ValueError(f"noise_refresh must be >= 0 (0: never), got {self.noise_refresh}.")
    if self.history.max_tokens and self.noise != "prompt":
      raise ValueError("history needs noise = 'prompt' (a stored response replays only under "
                       "the noise it was drawn with); set rollout.noise = 'prompt'.")

  def check_rule(self, spec) -> None:
    """Raises where replay meets a speculation config (`spec`, or None) it cannot run with: it
    re-verifies stored responses under the `coupled` rule only."""
    if self.chunk and spec is not None and spec.rule == "rejection":
      raise ValueError("replay re-verifies stored responses under the 'coupled' rule only; set "
                       "spec.rule = 'coupled' or rollout.history.chunk = 0.")

  @property
  def chunk(self) -> int:
    """Stored tokens verified per replay step (0: no replay)."""
    return self.history.chunk

  @classmethod
  def from_section(cls, rollout) -> ReplayConfig:
    """From a config's `rollout` section (`rollout.history` checked key by key)."""
    return cls(rollout.get("noise", "step"), rollout.get("noise_refresh", 0),
               typed(HistoryConfig, dict(rollout.get("history") or {}), "rollout.history"))


class StoredResponses:
  """The last response of each prompt-addressed sample, at most `max_tokens` tokens in all."""

  def __init__(self, max_tokens: int):
    if max_tokens < 1:
      raise ValueError(f"history max_tokens must be >= 1, got {max_tokens}.")
    self.max_tokens = max_tokens
    self.total = 0
    self._entries: collections.OrderedDict = collections.OrderedDict()  # key -> (epoch, tokens)

  def __len__(self) -> int:
    return len(self._entries)

  @staticmethod
  def sample_key(address_W) -> tuple[int, ...]:
    """The sample an address names (its words but the noise epoch): where it is stored."""
    words = np.asarray(address_W).astype(np.uint32)
    return tuple(int(words[w]) for w in _KEY_WORDS)

  def store(self, addresses_RxW, responses) -> None:
    """Keeps each row's response under its address (replacing that sample's older one), then
    evicts the least recently stored until the total fits `max_tokens`."""
    for address, tokens in zip(addresses_RxW, responses):
      key = self.sample_key(address)
      if key in self._entries:
        self.total -= len(self._entries.pop(key)[1])
      epoch = int(np.asarray(address).astype(np.uint32)[_EPOCH_WORD])
      self._entries[key] = (epoch, np.asarray(tokens, np.int32))
      self.total += len(tokens)
    while self.total > self.max_tokens:
      self.total -= len(self._entries.popitem(last=False)[1][1])

  def lookup(self, addresses_RxW) -> list[np.ndarray | None]:
    """Each row's stored response, when one was drawn under the row's noise epoch (else None)."""
    out = []
    for address in addresses_RxW:
      entry = self._entries.get(self.sample_key(address))
      epoch = int(np.asarray(address).astype(np.uint32)[_EPOCH_WORD])
      out.append(entry[1] if entry is not None and entry[0] == epoch else None)
    return out

  def corpus(self, addresses_RxW, group_size: int) -> dict[int, list[int]]:
    """By prompt index (rows `i * G .. (i+1) * G`): the stored responses of that prompt's
    samples, one after another (earlier text the suffix proposer may draft from)."""
    out = {}
    for i in range(len(addresses_RxW) // group_size):
      text = [t for r in self.lookup(addresses_RxW[i * group_size:(i + 1) * group_size])
              if r is not None for t in r.tolist()]
      if text:
        out[i] = text
    return out

  def state(self) -> dict:
    """The store as flat arrays (for a checkpoint), oldest first; `shapes` gives their sizes."""
    keys = np.array([k for k in self._entries], np.uint32).reshape(-1, len(_KEY_WORDS))
    epochs = np.array([e for e, _ in self._entries.values()], np.int32)
    lengths = np.array([len(t) for _, t in self._entries.values()], np.int32)
    tokens = (np.concatenate([t for _, t in self._entries.values()]) if self._entries
              else np.zeros(0, np.int32))
    # One sentinel element each: a checkpoint holds no empty arrays.
    return {"keys": np.concatenate([keys, np.zeros((1, len(_KEY_WORDS)), np.uint32)]),
            "epochs": np.append(epochs, np.int32(0)), "lengths": np.append(lengths, np.int32(0)),
            "tokens": np.append(tokens, np.int32(0))}

  @staticmethod
  def shapes(state: dict) -> dict:
    """The array shapes of a `state()` (what a checkpoint's metadata records)."""
    return {k: list(np.shape(v)) for k, v in state.items()}

  def load_state(self, state: dict) -> None:
    """Restores a `state()`."""
    keys, epochs = np.asarray(state["keys"])[:-1], np.asarray(state["epochs"])[:-1]
    lengths, tokens = np.asarray(state["lengths"])[:-1], np.asarray(state["tokens"])[:-1]
    ends = np.cumsum(lengths)
    self._entries = collections.OrderedDict(
        (tuple(int(w) for w in k), (int(e), tokens[end - n:end].astype(np.int32)))
        for k, e, n, end in zip(keys, epochs, lengths, ends))
    self.total = int(lengths.sum())


class PromptMemory:
  """What a run with prompt-addressed noise keeps per prompt across steps: its visits (hence its
  noise epoch, `rollout/noise.PromptNoise`) and, with a store, its samples' last responses. It
  turns a round's prompts into the engine's `generate` arguments and takes back its responses."""

  def __init__(self, cfg: ReplayConfig):
    self.cfg = cfg
    self.noise = PromptNoise(cfg.noise_refresh)
    self.history = StoredResponses(cfg.history.max_tokens) if cfg.history.max_tokens else None

  def request(self, prompts, group_size: int) -> dict:
    """`generate` arguments of a round of this step: each row's address, and with a store each
    prompt's stored responses as the suffix proposer's corpus and, with replay, each row's to
    replay."""
    addresses = self.noise.addresses(prompts, group_size)
    if self.history is None:
      return {"addresses": addresses}
    return {"addresses": addresses, "corpus": self.history.corpus(addresses, group_size),
            "replay": self.history.lookup(addresses) if self.cfg.chunk else None}

  def record(self, addresses_RxW, responses) -> None:
    """Stores a round's responses under their addresses."""
    if self.history is not None:
      self.history.store(addresses_RxW, responses)

  def end_step(self) -> None:
    """Closes the step: every prompt drawn in it counts a visit."""
    self.noise.end_step()

  def state(self) -> dict:
    """Visits and store as arrays (for a checkpoint)."""
    out = {"visits": self.noise.state()}
    if self.history is not None:
      out["history"] = self.history.state()
    return out

  def load_state(self, state: dict) -> None:
    """Restores a `state()`."""
    self.noise.load_state(state["visits"])
    if self.history is not None:
      self.history.load_state(state["history"])
