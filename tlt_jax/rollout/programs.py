"""The rollout's programs: how each executable the engine runs is built (prefill, a dispatch of
plain or speculative decoding steps, compaction into a smaller batch bucket) for a shard and a
`Layout`, which of them a call can reach, and the pool that compiles, caches and shares them.
The engine (`rollout/engine.py`) schedules them; this file never runs one.

Shape letters: the decoding layers' legend in `tlt_jax/spec/__init__.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import os
import pathlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from tlt_jax.models import kv_cache as kvc
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.models.sharding import TP
from tlt_jax.rollout.pool import ExecutablePool
from tlt_jax.rollout.replay import ReplayState
from tlt_jax.rollout.shards import placed_shapes
from tlt_jax.rollout.spec_step import replay_step, spec_step
from tlt_jax.rollout.state import DecodeState, empty_state, needs_layers, plain_step
from tlt_jax.spec.proposer import DraftModel, get_proposer

# The packages whose code a rollout program traces: every layer below `rl` (models -> spec ->
# rollout -> drafter). Editing anything else (the trainer, a launcher) keeps the cached programs.
TRACED_PACKAGES = ("models", "kernels", "spec", "rollout", "drafter")


class Layout(NamedTuple):
  """What every program of a call shares: the KV cache's slots, the new tokens per row, whether
  hidden states are captured, the width of the rows' context for proposers that read it, the
  words of a row's noise address (`rollout/noise.py`) and whether rows carry a stored response
  to replay (`rollout/replay.py`)."""

  cache_len: int
  n: int
  capture: bool
  ctx_len: int
  words: int = 1
  replay: bool = False


def traced_source_digest(root: pathlib.Path | None = None) -> str:
  """A digest of the source of `TRACED_PACKAGES` under `root` (the installed tlt_jax)."""
  root = root or pathlib.Path(__file__).resolve().parents[1]
  src = hashlib.sha256()
  for package in TRACED_PACKAGES:
    for f in sorted((root / package).rglob("*.py")):
      src.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
  return src.hexdigest()


def registered_source_digest(spec) -> str:
  """A digest of the modules outside this package whose code `spec`'s programs trace: those of
  the proposers a user registered (`spec.proposer.register`). A module whose source cannot be
  read (one defined in a notebook cell) gets a digest of its own for this process, so its
  programs are never loaded by another."""
  src = hashlib.sha256()
  names = sorted({a.proposer for a in spec.arms if not a.is_plain}) if spec is not None else []
  for name in names:
    cls = type(get_proposer(name))
    module = inspect.getmodule(cls)
    if module is not None and module.__name__.split(".")[0] == __name__.split(".")[0]:
      continue  # in the package: `traced_source_digest` covers it
    try:
      src.update(module.__name__.encode() + b"\0" + inspect.getsource(module).encode())
    except (AttributeError, OSError, TypeError):  # no module, or no source to read
      src.update(f"{cls.__qualname__} unsourced {os.getpid()} {id(cls)}".encode())
  return src.hexdigest()


def bucket_for(n: int, buckets) -> int:
  """The smallest bucket that holds `n`."""
  for b in buckets:
    if b >= n:
      return b
  raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}.")


def cache_length(cfg, max_seq_len: int, longest: int, n: int, impl: str) -> int:
  """The KV cache slots of a row of an engine with settings `cfg` (`EngineConfig`) and attention
  `impl` for prompts up to `longest` tokens and `n` new tokens, within the model's context and
  never fewer than the tokens the row writes: the prompt bucket and the new tokens rounded up to
  a multiple of 64 (fewer layouts), then room for the slack (the tokens a speculative or replay
  step writes past a row's last one), rounded up to a multiple of 64 for `pallas` (its kernel
  tiles the cache by the largest power of two dividing it and reads only a row's own slots) and
  of 16 for `xla`, whose every step attends over all the slots (there a chain of 3's 5 slots of
  slack make 384 slots 400, not 448)."""
  need = longest + n + cfg.cache_slack
  p = bucket_for(longest, cfg.prefill_buckets)
  granule = 64 if impl == "pallas" else 16
  slots = max(-(-(p + n) // 64) * 64, p + n + cfg.cache_slack)
  return max(min(-(-slots // granule) * granule, max_seq_len), need)


def distinct_prompts(prompt_idx: list[int], b: int, buckets):
  """The distinct prompts of a wave's rows (first-appearance order), the bucketed count `u` of
  prefill rows, and each slot's source row; no sharing (`u` == `b`) when it saves nothing."""
  uniq = list(dict.fromkeys(prompt_idx))
  u = bucket_for(len(uniq), buckets)
  if u >= b:
    return prompt_idx, b, np.arange(b, dtype=np.int32)
  pos = {q: j for j, q in enumerate(uniq)}
  src = np.zeros(b, np.int32)
  src[: len(prompt_idx)] = [pos[q] for q in prompt_idx]
  return uniq, u, src


class Programs:
  """The executables of one engine: built from its model's and drafter's graph definitions, placed
  on its shards' meshes, fed the weights of its `WeightStore`, kept in one `ExecutablePool`."""

  def __init__(self, model, cfg, weights, meshes, *, pad_id: int, drafter: DraftModel | None,
               context_proposers: tuple, attention: str, cache_dtype: str, spec_config=None,
               words: int = 1, replay_chunk: int = 0):
    self.cfg, self.weights, self.meshes, self.pad_id = cfg, weights, meshes, pad_id
    self.words, self.replay_chunk = words, replay_chunk
    self.model_cfg, self.drafter, self.context_proposers = model.cfg, drafter, context_proposers
    self.attention, self.cache_dtype = attention, cache_dtype
    self.graphdef = nnx.split(model)[0]
    self.dgraphdef = nnx.split(drafter.module)[0] if drafter is not None else None
    self.lazy_follow = (drafter is not None and cfg.drafter_follow == "lazy"
                        and drafter.follows_lazily)
    self.pool = ExecutablePool(cache_dir=cfg.compile_cache_dir
                               or jax.config.jax_compilation_cache_dir or "",
                               fingerprint=self._fingerprint(spec_config),
                               twins=cfg.num_shards > 1)

  def layout(self, n: int, capture_hidden: bool, longest: int = 0) -> Layout:
    """The layout of a call's executables for `n` new tokens (hidden states captured when asked
    or when a lazy drafter reads them): cache and context lengths fixed by `max_prompt_len` when
    it is set, else by `longest`, the call's longest prompt."""
    longest = self.cfg.max_prompt_len or longest
    p = bucket_for(longest, self.cfg.prefill_buckets)
    need = longest + n + self.cfg.cache_slack
    if need > self.model_cfg.max_seq_len:
      raise ValueError(f"Prompt of {longest} tokens + max_new_tokens {n} + slack "
                       f"{self.cfg.cache_slack} = {need} exceeds the model context "
                       f"{self.model_cfg.max_seq_len}; shorten the prompt or max_new_tokens.")
    # The rows' context (corpus, prompt), then the response, then the next token a proposer
    # drafts after; nothing when no proposer reads it.
    context_len = self.cfg.corpus_len + p + n + 1 if self.context_proposers else 0
    cache_len = cache_length(self.cfg, self.model_cfg.max_seq_len, longest, n, self.attention)
    return Layout(cache_len, n, capture_hidden or self.lazy_follow, context_len, self.words,
                  self.replay_chunk > 0)

  def _fingerprint(self, spec) -> str:
    """What, besides the pool key, determines a compiled program: the source it traces, the
    model, the weights' shapes, the devices and the engine's settings."""
    shapes = jax.tree.map(lambda x: (x.shape, str(x.dtype)), self.weights.abstract(0))
    return "|".join([jax.__version__, repr(self.model_cfg), repr(self.model_cfg.llama3_rope),
                     self.model_cfg.numerics,
                     repr(shapes), traced_source_digest(), registered_source_digest(spec),
                     repr(self.pad_id), repr([m.devices.tolist() for m in self.meshes]),
                     repr(self.cfg), repr(spec), repr((self.words, self.replay_chunk,
                                                       self.attention, self.cache_dtype))])

  def _merge(self, weights):
    model = nnx.merge(self.graphdef, weights[0])
    if weights[1] is None:
      return model, None
    return model, self.drafter.bind(nnx.merge(self.dgraphdef, weights[1]))

  def _abstract(self, tree, shard: int):
    """`tree`'s shapes, whole on each of shard `shard`'s devices."""
    return placed_shapes(tree, jax.tree.map(lambda _: self.weights.sharding(shard), tree))

  def _state_shardings(self, state, shard: int):
    """Where a decode state (or its shapes) lives on shard `shard`: whole on each device, but
    for the policy's KV cache, whose kv heads split over `tp` like the weights that write them."""
    tree = jax.tree.map(lambda _: self.weights.sharding(shard), state)
    if self.cfg.tp == 1:
      return tree
    kv = NamedSharding(self.meshes[shard], PartitionSpec(None, TP))  # [B, K, ...]
    cache = tree.cache.replace(k=(kv,) * len(tree.cache.k), v=(kv,) * len(tree.cache.v))
    return dataclasses.replace(tree, cache=cache)

  def _abstract_state(self, shape, shard: int):
    return placed_shapes(shape, self._state_shardings(shape, shard))

  def _placed(self, state, shard: int):
    """`state` constrained to `_state_shardings`, so that a program returns it where the next
    one expects it (nothing to do on a one-device shard)."""
    if self.cfg.tp == 1:
      return state
    return jax.lax.with_sharding_constraint(state, self._state_shardings(state, shard))

  def _empty_state(self, b: int, layout: Layout, drafter: DraftModel | None):
    return empty_state(self.model_cfg, b, layout, self.pad_id, drafter, self.context_proposers,
                       self.attention, self.cache_dtype)

  def state_shape(self, b: int, layout: Layout):
    """The abstract decode state of `b` rows under `layout` (what every program carries)."""
    return jax.eval_shape(lambda: self._empty_state(b, layout, self.drafter))

  def prefill(self, shard: int, b: int, u: int, p: int, layout: Layout):
    """Prefill of `b` rows whose prompts are `u` distinct ones (`u` < `b`: the G samples of a
    prompt share one forward, and its cache rows are copied to them; `u` == `b`: one row each)."""
    cache_len, ctx_len = layout.cache_len, layout.ctx_len
    key = ("prefill", shard, b, u, p, *layout)
    cfg = self.model_cfg

    def fn(weights, prompts_UxP, lens_U, src_B, ids_BxW, active_B, context_BxH, context_len_B,
           replay_BxN, replay_len_B):
      model, drafter = self._merge(weights)
      st = self._empty_state(b, layout, drafter)
      shared = u < b
      rows_of = (lambda x: x[src_B]) if shared else (lambda x: x)
      cache = (kvc.init_cache(cfg, u, cache_len, self.cache_dtype, self.attention) if shared
               else st.cache)
      out = model(prompts_UxP, cache, return_layers=needs_layers(drafter))
      cache = jax.tree.map(rows_of, kvc.commit(out.cache, lens_U))
      urows, last_U = jnp.arange(u), lens_U - 1
      st = dataclasses.replace(
          st, cache=cache, logits_BxV=rows_of(out.logits_BxTxV[urows, last_U]), address_BxW=ids_BxW,
          done_B=~active_B,
          captured=dataclasses.replace(st.captured, prompt_hidden_BxD=rows_of(
              out.hidden_BxTxD[urows, last_U]).astype(st.captured.prompt_hidden_BxD.dtype)),
          proposers={p.name: p.start(context_BxH, context_len_B)
                     for p in self.context_proposers},
          replay=ReplayState.start(replay_BxN, replay_len_B))
      if drafter is not None:
        draft = drafter.init_state(cfg, u, cache_len, self.attention) if shared else st.draft
        draft = drafter.prefill(model, draft, prompts_UxP, out, lens_U)  # it reads it too
        st = dataclasses.replace(st, draft=jax.tree.map(rows_of, draft))
      return self._placed(st, shard)

    def build():
      i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)
      args = (i32(u, p), i32(u), i32(b), i32(b, layout.words), jax.ShapeDtypeStruct((b,), bool),
              i32(b, ctx_len), i32(b), i32(b, layout.n if layout.replay else 0), i32(b))
      return fn, (self.weights.abstract(shard), *(self._abstract(a, shard) for a in args)), ()
    return key, build

  def _loop(self, shard: int, b: int, layout: Layout, params: SamplingParams, step_fn, name):
    """A dispatch: up to `steps_per_dispatch` applications of `step_fn` (stops when all done)."""
    n = layout.n
    key = (name, shard, b, *layout, params)
    k_steps, pad_id = self.cfg.steps_per_dispatch, self.pad_id
    stop_ids = jnp.array(params.stop_tokens or (-1,), jnp.int32)

    def fn(weights, state: DecodeState, key_):
      model, drafter = self._merge(weights)
      body = lambda c: (c[0] + 1, step_fn(model, drafter, c[1], params, key_, stop_ids, n,
                                          pad_id))
      cond = lambda c: (c[0] < k_steps) & ~jnp.all(c[1].done_B)
      return self._placed(jax.lax.while_loop(cond, body, (jnp.int32(0), state))[1], shard)

    def build():
      args = (self.weights.abstract(shard),
              self._abstract_state(self.state_shape(b, layout), shard),
              self._abstract(jax.eval_shape(lambda: jax.random.key(0)), shard))
      return fn, args, (1,)
    return key, build

  def decode(self, shard: int, b: int, layout: Layout, params: SamplingParams):
    """Plain decoding steps (a dispatch) of `b` rows."""
    step = functools.partial(plain_step, follow=not self.lazy_follow)
    return self._loop(shard, b, layout, params, step, "decode")

  def speculative(self, shard: int, b: int, layout: Layout, params: SamplingParams, strategy,
                  rule: str):
    """Speculative steps (a dispatch) of `b` rows with the arm `strategy` under `rule`."""
    step = functools.partial(spec_step, strategy=strategy, rule=rule)
    return self._loop(shard, b, layout, params, step, ("spec", strategy, rule))

  def replay(self, shard: int, b: int, layout: Layout, params: SamplingParams):
    """Replay steps (a dispatch) of `b` rows: `replay_chunk` stored tokens verified per step."""
    step = functools.partial(replay_step, chunk=self.replay_chunk, follow=not self.lazy_follow)
    return self._loop(shard, b, layout, params, step, ("replay", self.replay_chunk))

  def compact(self, shard: int, b_old: int, b_new: int, layout: Layout):
    """The gather of a decode state's rows into a smaller batch bucket."""
    key = ("compact", shard, b_old, b_new, *layout)

    def fn(state, idx_B):
      return self._placed(jax.tree.map(lambda x: x[idx_B], state), shard)

    def build():
      args = (self._abstract_state(self.state_shape(b_old, layout), shard),
              self._abstract(jax.ShapeDtypeStruct((b_new,), jnp.int32), shard))
      return fn, args, ()  # shapes shrink: no reuse
    return key, build

  def twins(self, key) -> list:
    """The keys of the program `key` on the other shards: the pool moves whichever is built
    onto this shard's devices instead of compiling it again (every key is (name, shard, ...))."""
    return [(key[0], t, *key[2:]) for t in range(len(self.meshes)) if t != key[1]]

  def get(self, key_build):
    """The executable of a (key, build) pair, compiled, loaded or moved from a twin as needed."""
    key, build = key_build
    return self.pool.get(key, self.in_mesh(key[1], build), twins=self.twins(key))

  def in_mesh(self, shard: int, build):
    """`build` whose program is traced under shard `shard`'s mesh when it spans tp devices, so
    that the attention kernel runs on each device's own kv heads (`kernels.attention`)."""
    if self.cfg.tp == 1:
      return build
    mesh = self.meshes[shard].abstract_mesh

    def in_mesh():
      fn, args, donate = build()

      def traced(*a):
        with jax.sharding.use_abstract_mesh(mesh):
          return fn(*a)
      return traced, args, donate
    return in_mesh

  def reachable(self, s: int, wave_prompts, p_buckets, layout: Layout, params: SamplingParams,
                spec) -> list:
    """(key, build) of every executable shard `s` can run for waves whose rows have these prompt
    indices, with prompts in `p_buckets`: prefills, plain decoding, replay (when on) and
    compaction at every bucket up to its widest wave, and speculative arms where they may run."""
    out, top = [], 0
    for prompt_idx in wave_prompts:
      b = bucket_for(len(prompt_idx), self.cfg.batch_buckets)
      u = distinct_prompts(prompt_idx, b, self.cfg.batch_buckets)[1]
      top = max(top, b)
      out += [self.prefill(s, b, u, p, layout) for p in p_buckets]
    reachable = [b for b in self.cfg.batch_buckets if b <= top]
    for b in reversed(reachable):
      out.append(self.decode(s, b, layout, params))
      if layout.replay:
        out.append(self.replay(s, b, layout, params))
      if spec is not None and spec.may_run(b):
        out += [self.speculative(s, b, layout, params, arm, spec.config.rule)
                for arm in spec.config.arms if not arm.is_plain]
      smaller = [x for x in reachable if x < b]
      if smaller:  # compaction steps one bucket down at a time
        out.append(self.compact(s, b, smaller[-1], layout))
    return out
