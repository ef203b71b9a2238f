"""The rollout's scheduling, apart from the programs it runs: a call's rows and waves (`Call`,
`split_waves`), what each busy shard is doing (`ShardRun`), which shard to serve next
(`next_ready`), and the dispatch policy (`Scheduler`): each wave's host inputs, what each dispatch
runs (replay, a speculative arm or plain decoding), what a finished dispatch records, and when a
batch compacts into a smaller bucket. The engine (`rollout/engine.py`) builds, places and runs the
programs these name.

The engine dispatches every busy shard's next steps without waiting, then serves shards in the
order their dispatches complete (`next_ready` polls the arrays instead of blocking on one shard
in turn): a shard that finishes early is harvested, compacted or handed its next wave while the
others still run.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rollout.captured import CapturedHidden
from tlt_jax.rollout.noise import step_addresses
from tlt_jax.rollout.plain import pad_prompts
from tlt_jax.rollout.programs import Layout, bucket_for, distinct_prompts
from tlt_jax.rollout.replay_choice import ReplayChoice
from tlt_jax.rollout.state import DecodeState
from tlt_jax.rollout.timeline import Timeline
from tlt_jax.spec.controller import SpecController
from tlt_jax.spec.proposer import get_proposer
from tlt_jax.spec.strategy import Strategy

_POLL_S = 1e-4


@dataclasses.dataclass
class ShardRun:
  """A busy shard's wave: its decode state on the device and the host's view of its rows."""

  state: DecodeState
  b: int                   # batch bucket
  slots: np.ndarray        # the row of each slot (-1: padding)
  live: int                # live rows
  t: np.ndarray            # tokens each slot had emitted at the last sync
  ss: np.ndarray           # speculative steps each slot had taken at the last sync
  arm: int | None = None   # the arm of the dispatch in flight (None: plain or replay)
  t0: float = 0.0          # when it was launched
  kind: str = "decode"     # what the dispatch in flight runs: decode, spec:<arm> or replay
  replaying: np.ndarray | None = None  # which slots' live rows still replay their stored responses
  replayed: np.ndarray | None = None  # tokens each slot had emitted by replay at the last sync
  # Whether a lazily-following draft model has read every emitted token (after a speculative
  # dispatch that drafted with it); why the dispatch in flight is not the arm's steady speed:
  # "catch_up" (it first feeds a lazy drafter the plain steps' tokens), "compiling" (background
  # compiles share the host with it), or "" (neither).
  drafter_current: bool = False
  apart: str = ""


def next_ready(runs: dict[int, ShardRun]) -> int:
  """The shard (a key of `runs`) whose dispatch in flight completes first; with one shard, that
  shard (the caller then blocks on it)."""
  if len(runs) == 1:
    return next(iter(runs))
  while True:
    for s, run in runs.items():
      if run.state.done_B.is_ready():
        return s
    time.sleep(_POLL_S)


class Results:
  """Host buffers for a call's `R` rows of up to `N` new tokens, filled as shards finish rows;
  captured hidden states (`hidden`) stay on the devices, in `hidden_dtype` (the model's compute
  dtype), until the drafter reads them."""

  def __init__(self, rows: int, n: int, d_model: int, pad_id: int, hidden: bool,
               hidden_dtype="float32"):
    self.tokens_RxN = np.full((rows, n), pad_id, np.int32)
    self.logprobs_RxN = np.zeros((rows, n), np.float32)
    self.lengths_R = np.zeros(rows, np.int32)
    self.stopped_R = np.zeros(rows, bool)
    self.hidden = (CapturedHidden(rows, n, d_model, jnp.dtype(hidden_dtype)) if hidden
                   else None)

  def harvest(self, st: DecodeState, slots: np.ndarray, rows: np.ndarray, last: bool) -> None:
    """Copies the given slots of a shard's state into their rows (`last`: the state is not
    dispatched again)."""
    host = jax.device_get((st.tokens_BxN, st.logprobs_BxN, st.t_B, st.stopped_B))
    for slot, r in zip(slots, rows):
      self.tokens_RxN[r], self.logprobs_RxN[r] = host[0][slot], host[1][slot]
      self.lengths_R[r], self.stopped_R[r] = host[2][slot], host[3][slot]
    if self.hidden is not None:
      self.hidden.harvest(st.captured.hidden_BxNxD, st.captured.prompt_hidden_BxD, slots, rows,
                          last)


def split_waves(cfg, total: int) -> list[list[np.ndarray]]:
  """Rows of each shard's waves: the `cfg.num_shards` shards take contiguous blocks of the
  `total` rows, and each shard processes its block in waves of at most `cfg.max_batch` rows."""
  blocks = np.array_split(np.arange(total), cfg.num_shards)
  return [[blk[i: i + cfg.max_batch] for i in range(0, len(blk), cfg.max_batch)]
          for blk in blocks]


@dataclasses.dataclass
class Call:
  """One `generate` call: the request, its layout, each shard's waves and the host results."""

  prompts: list[list[int]]
  rows: list[tuple[int, int]]      # (sample id, prompt index) of each row
  addresses: np.ndarray            # [R, W] each row's noise address
  replay: list                     # each row's stored response to replay (None: none)
  waves: list[list[np.ndarray]]    # each shard's waves of rows, not yet started
  params: SamplingParams
  p_bucket: int                    # the prompt bucket of every prefill
  layout: Layout                   # what the call's programs share
  corpus: dict[int, list[int]]
  keys: list[jax.Array]            # the sampling key on each shard
  out: Results
  timeline: Timeline


@dataclasses.dataclass(frozen=True)
class Wave:
  """A wave's prefill inputs on the host: its rows, batch bucket `b` and distinct prompts `u`,
  and the arrays the prefill program takes, in its order (prompts, lengths, each row's prompt,
  addresses, active rows, contexts and their lengths, stored responses and their lengths)."""

  rows: np.ndarray
  b: int
  u: int
  arrays: tuple


@dataclasses.dataclass(frozen=True)
class Dispatch:
  """What a shard's next dispatch runs: `kind` "decode", "replay" or "spec:<arm name>", with the
  controller's `arm` (its plain arm too; None: no controller's choice) and, for a speculative
  one, its `strategy`."""

  kind: str
  arm: int | None = None
  strategy: Strategy | None = None


@dataclasses.dataclass(frozen=True)
class Compaction:
  """A batch moved into a smaller bucket, one bucket down at a time (`chain`): the first gather
  puts the slots `idx` first (the live rows, then a done filler), each later one keeps the
  leading rows; `b` is the new bucket."""

  chain: list[int]
  idx: np.ndarray
  b: int


class Scheduler:
  """The dispatch policy of an engine's calls over its `cfg` (batch buckets, steps per
  dispatch, corpus width): the controller `spec` picks speculative arms, `replay` when to replay
  stored responses; `lazy_follow`: a draft model reads the plain steps' tokens only when it next
  drafts."""

  def __init__(self, cfg, spec: SpecController | None, replay: ReplayChoice, lazy_follow: bool):
    self.cfg, self.spec, self.replay, self.lazy_follow = cfg, spec, replay, lazy_follow

  def wave(self, call: Call, s: int, pad_id: int) -> Wave:
    """Shard `s`'s next wave, taken off its list, as the prefill's host inputs (the G samples of
    a prompt share one prompt forward)."""
    rows = call.waves[s].pop(0)
    b = bucket_for(len(rows), self.cfg.batch_buckets)
    prefill_idx, u, src_np = distinct_prompts([call.rows[r][1] for r in rows], b,
                                              self.cfg.batch_buckets)
    prompts_np, lens_np = pad_prompts([call.prompts[q] for q in prefill_idx], call.p_bucket,
                                      pad_id)
    context_np, context_len = _contexts(call, rows, b, self.cfg.corpus_len)
    pad, upad = b - len(rows), u - len(prefill_idx)
    prompts_np = np.pad(prompts_np, ((0, upad), (0, 0)), constant_values=pad_id)
    lens_np = np.pad(lens_np, (0, upad), constant_values=1)
    ids_np = np.pad(call.addresses[rows], ((0, pad), (0, 0)))
    replay_np, replay_len = _stored(call, rows, b, call.layout)
    active = np.arange(b) < len(rows)
    return Wave(rows, b, u, (prompts_np, lens_np, src_np, ids_np, active, context_np, context_len,
                             replay_np, replay_len))

  @staticmethod
  def started(wave: Wave, state: DecodeState) -> ShardRun:
    """The shard's run of a prefilled `wave`."""
    pad = wave.b - len(wave.rows)
    replay_len, active = wave.arrays[8], wave.arrays[4]
    return ShardRun(state, wave.b, np.concatenate([wave.rows, np.full(pad, -1)]), len(wave.rows),
                    np.zeros(wave.b, np.int64), np.zeros(wave.b, np.int64),
                    replaying=(replay_len > 0) & active, replayed=np.zeros(wave.b, np.int64))

  def choose(self, run: ShardRun, compiling: bool) -> Dispatch:
    """What `run`'s next dispatch runs: replay where `ReplayChoice` says it is faster for the
    rows still replaying, else the arm the controller picks for its batch, or plain decoding.
    Marks the run with it (`compiling`: background compiles share the host with it)."""
    dispatch = Dispatch("decode")
    if self.replay.replays(run.b, run.live, int(np.sum(run.replaying))):
      dispatch = Dispatch("replay")
    elif self.spec is not None:
      arm = self.spec.choose(run.b, run.live)
      if arm is not None and not self.spec.is_plain(arm):
        strategy = self.spec.config.arms[arm]
        dispatch = Dispatch(f"spec:{strategy.name}", arm, strategy)
      else:  # plain decoding, as the controller's plain arm (its statistics count it) or none
        dispatch = Dispatch("decode", arm)
    drafts = (dispatch.strategy is not None
              and get_proposer(dispatch.strategy.proposer).uses_draft_model)
    # A lazy drafter reads what it missed at the start of its next drafting dispatch.
    catch_up = drafts and self.lazy_follow and not run.drafter_current
    run.apart = "compiling" if compiling else "catch_up" if catch_up else ""
    run.drafter_current = drafts or not self.lazy_follow
    run.kind, run.arm, run.t0 = dispatch.kind, dispatch.arm, time.perf_counter()
    return dispatch

  def settled(self, call: Call, s: int, run: ShardRun, synced: tuple) -> tuple:
    """Records `run`'s finished dispatch (its `synced` host arrays: done, emitted tokens,
    speculative steps, replaying, replayed tokens per slot) in the timeline, the replay choice
    and the controller; returns (live slots, finished slots)."""
    done, t_now, ss_now, on_now, rp_now = synced
    wall = time.perf_counter() - run.t0
    live_slots = np.flatnonzero(~done & (run.slots >= 0))
    emitted = int(np.sum(t_now - run.t))
    call.timeline.record(s, run.kind, run.t0, time.perf_counter(), run.b, run.live,
                         steps=self.cfg.steps_per_dispatch, live_after=len(live_slots),
                         tokens=emitted, replayed=int(np.sum(rp_now - run.replayed)))
    if run.kind == "replay":
      on = run.replaying  # the rows that replayed at the dispatch's start
      self.replay.record(int(np.sum((t_now - run.t)[on])), int(np.sum(on)),
                         self.cfg.steps_per_dispatch)
    run.replaying, run.replayed = on_now & ~done & (run.slots >= 0), rp_now
    if run.arm is not None:
      self.spec.record(run.b, run.arm, emitted, int(np.sum(ss_now - run.ss)), wall, run.live,
                       apart=run.apart)
    run.t, run.ss = t_now, ss_now
    return live_slots, np.flatnonzero(done & (run.slots >= 0))

  def compaction(self, run: ShardRun, live_slots: np.ndarray, done: np.ndarray
                 ) -> Compaction | None:
    """The move of `run`'s live rows into the smallest bucket that holds them, None where that
    is its own."""
    new_b = bucket_for(len(live_slots), self.cfg.batch_buckets)
    if new_b >= run.b:
      return None
    filler = np.flatnonzero(done)[0]  # a done slot: padding rows must stay done
    chain = [x for x in reversed(self.cfg.batch_buckets) if new_b <= x < run.b]
    idx = np.concatenate([live_slots, np.full(chain[0] - len(live_slots), filler)])
    return Compaction(chain, idx, new_b)

  @staticmethod
  def compacted(run: ShardRun, c: Compaction, live: int) -> None:
    """`run`'s host view after compaction `c` of its `live` rows."""
    idx = c.idx[:c.b]
    slots = run.slots[idx]
    slots[live:] = -1  # padding slots: already harvested, never harvested again
    run.slots, run.b = slots, c.b
    run.t, run.ss, run.replayed = run.t[idx], run.ss[idx], run.replayed[idx]
    run.replaying = run.replaying[idx] & (slots >= 0)


def row_inputs(r: int, first_sample: int, addresses, replay, words: int, noise: str,
               replay_chunk: int) -> tuple[np.ndarray, list]:
  """A call's per-row inputs checked: each of its `r` rows' noise address (`words` wide; by
  default its sample id) and stored response to replay (None: none; all None without replay)."""
  if addresses is None:
    addresses = step_addresses(r, first_sample, words)
  if np.shape(addresses) != (r, words) or (replay is not None and len(replay) != r):
    raise ValueError(f"addresses must be [rows, words] = {(r, words)} for this engine "
                     f"(noise={noise!r}) and replay one entry per row, got "
                     f"{np.shape(addresses)} and {None if replay is None else len(replay)}.")
  replay = replay if replay_chunk and replay is not None else [None] * r
  return np.asarray(addresses, np.int32), replay


def warm_up_waves(cfg, calls) -> list[list[list[list[int]]]]:
  """For each call shape `(num_prompts, group_size)`, each shard's waves as the prompt index of
  each of their rows: what the warm-up builds the reachable programs of."""
  return [[[[int(r) // group_size for r in wave] for wave in waves]
           for waves in split_waves(cfg, num_prompts * group_size)]
          for num_prompts, group_size in calls]


def _stored(call: Call, wave, b: int, layout: Layout) -> tuple[np.ndarray, np.ndarray]:
  """Each slot's stored response to replay (`[b, n]`, `[b, 0]` when replay is off) and its
  length (0: none)."""
  tokens_np = np.zeros((b, layout.n if layout.replay else 0), np.int32)
  len_np = np.zeros(b, np.int32)
  for slot, r in enumerate(wave):
    stored = call.replay[r]
    if layout.replay and stored is not None and len(stored):
      m = min(len(stored), layout.n)
      tokens_np[slot, :m], len_np[slot] = stored[:m], m
  return tokens_np, len_np


def _contexts(call: Call, wave, b: int, corpus_len: int) -> tuple[np.ndarray, np.ndarray]:
  """Each slot's context for the proposers that read it: the last `corpus_len` tokens of its
  prompt's corpus, then the prompt (`[b, context_len]`, -1 past each length)."""
  width = call.layout.ctx_len
  context_np, len_np = np.full((b, width), -1, np.int32), np.zeros(b, np.int32)
  if not width:
    return context_np, len_np
  for slot, r in enumerate(wave):
    q = call.rows[r][1]
    text = list(call.corpus.get(q, []))
    seq = text[max(len(text) - corpus_len, 0):] + list(call.prompts[q])
    context_np[slot, : len(seq)], len_np[slot] = seq, len(seq)
  return context_np, len_np
