"""Versioned publishing of drafter weights to the rollout engine, with checks.

A candidate replaces the drafter in use only if every weight is finite and its accepted length on
a held-back sample (segments of the newest rollout, never trained on) has not collapsed: it must
reach `min_ratio` x that of the version in use. The engine installs a version on every shard
between dispatches, never in the middle of a verification.

The accepted length is estimated by teacher forcing: at each position the drafter's greedy
prediction is compared with the target's, and a draft chain of `depth` from position i is accepted
up to its first miss, so the estimate is the mean over i of 1 + (consecutive hits from i, <= depth).
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tlt_jax.models.transformer import token_state
from tlt_jax.rollout.port import DrafterPort



@dataclasses.dataclass(frozen=True)
class PublishConfig:
  """How a candidate drafter is checked before it is published: the chain depth it is scored at,
  the share of the in-use version's accepted length it must keep, and the rows' length."""

  depth: int = 4               # the chain depth a candidate is scored at
  min_ratio: float = 0.8        # of the in-use version's accepted length on the same sample
  seq_len: int = 128            # tokens per held-back row it is scored on


def chain_accept_len(hits_BxL: np.ndarray, valid_BxL: np.ndarray, depth: int) -> float:
  """Mean over valid positions of 1 + the run of consecutive hits starting there (<= depth)."""
  b, l = hits_BxL.shape
  run = np.zeros((b, l + 1), np.int64)
  for t in range(l - 1, -1, -1):
    run[:, t] = np.where(hits_BxL[:, t] & valid_BxL[:, t], run[:, t + 1] + 1, 0)
  acc = 1 + np.minimum(run[:, :l], depth)
  return float(acc[valid_BxL].mean()) if valid_BxL.any() else 0.0


def teacher_forced_hits(drafter, target, toks_BxL, hidden_BxLxD, mask_BxL):
  """Per position t: does the drafter's greedy token after t+1 equal the target's?"""
  emb = target.embed_tokens(toks_BxL[:, 1:])
  g, _ = drafter(emb, drafter.project(hidden_BxLxD[:, :-1]))
  draft = drafter.token_ids(jnp.argmax(drafter.logits(target, g), -1))
  want = jnp.argmax(target.head(hidden_BxLxD[:, 1:]), -1)
  valid = (mask_BxL[:, 1:] * mask_BxL[:, :-1]) > 0
  return draft == want, valid


class DrafterPublisher:
  """Checks candidates and installs accepted ones on every rollout shard with increasing
  versions, through the engine's `DrafterPort`."""

  def __init__(self, port: DrafterPort, cfg: PublishConfig):
    self.port, self.cfg = port, cfg
    self.events: list[dict] = []
    graphdef, tgraphdef = port.drafter_graphdef, port.token_graphdef

    @jax.jit
    def hits(dparams, tparams, toks, hidden, mask):
      return teacher_forced_hits(nnx.merge(graphdef, dparams), nnx.merge(tgraphdef, tparams),
                                 toks, hidden, mask)
    self._hits = hits

  @property
  def version(self) -> int:
    """The drafter version in use: the engine's weight store keeps the one counter."""
    return self.port.drafter_version

  def accept_len(self, dparams, target_params, batch) -> float:
    """Estimated accepted length of drafter `dparams` on a packed batch of held-back segments
    (`DataBuffer.pack`: tokens, hidden states, mask)."""
    toks, hidden, mask = batch
    put = lambda t: jax.device_put(t, self.port.devices[0])  # wherever they were trained
    h, v = self._hits(put(dparams), put(token_state(target_params)), toks, hidden, mask)
    return chain_accept_len(np.asarray(h), np.asarray(v), self.cfg.depth)

  @staticmethod
  def finite(params) -> bool:
    """Whether every parameter is finite."""
    return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(params))

  def warm_up(self, dparams, target_params, batch) -> None:
    """Builds the check's programs by running it on `batch` (an empty packed batch of the
    shape the checks will have)."""
    self.accept_len(dparams, target_params, batch)

  def publish(self, candidate, target_params, batch, current=None, agree=None) -> bool:
    """Installs `candidate` (drafter params) if it passes the checks on `batch` (packed
    held-back segments; None: there are none); returns whether it did. `agree` turns this
    process's decision into the one all processes apply (process 0's)."""
    event = {"candidate_version": self.version + 1}
    if batch is None:
      event.update(accepted=False, reason="no held-back segment to check it on")
    elif not self.finite(candidate):
      event.update(accepted=False, reason="non-finite weights")
    else:
      new = self.accept_len(candidate, target_params, batch)
      old = self.accept_len(current, target_params, batch) if current is not None else 0.0
      event.update(accept_len=round(new, 4), in_use_accept_len=round(old, 4))
      if new < self.cfg.min_ratio * old or new <= 1.0:
        event.update(accepted=False, reason=f"accepted length {new:.2f} collapsed (in use: "
                                            f"{old:.2f}, min ratio {self.cfg.min_ratio})")
      else:
        event["accepted"] = True
    if agree is not None and agree(event["accepted"]) != event["accepted"]:
      event.update(accepted=not event["accepted"], reason="process 0 decided otherwise")
    self.events.append(event)
    if not event["accepted"]:
      logging.warning("drafter version %d refused: %s", self.version + 1, event["reason"])
      return False
    self.port.publish(candidate)
    return True
