"""`RolloutEngine`: batched sampling whose batch shrinks into smaller buckets as rows finish.

Rows are `(prompt, sample)` pairs with sample id `i = prompt_index * G + g`; the noise of row `i`
at response position `t` is addressed (see `models/sampling.py`), so a row's tokens do not depend on
which bucket, shard or dispatch produced them.

Each data-parallel shard is a sub-mesh of `tp` devices (`rollout/shards.py`) holding its own
copy of the weights (`rollout/weights.py`; with `tp` > 1 its heads and MLP split over the shard's
devices, and so do its KV cache's kv heads) and runs its own executables (not one SPMD program):
shards then shrink their batches independently, and a shard whose rows are all done goes idle at
once instead of stepping in lockstep with the busiest one. `generate` dispatches every busy shard
and serves whichever completes first (`rollout/scheduler.py`). The idle window is reported in the
timeline, and it is where the drafter trains.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from tlt_jax.kernels.attention import IMPLS, resolve_impl
from tlt_jax.models import kv_cache as kvc
from tlt_jax.models.precision import DTYPES
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.models.sharding import TP, check_tp
from tlt_jax.rollout import compiles
from tlt_jax.rollout.captured import CapturedHidden
from tlt_jax.rollout.plain import pad_prompts
from tlt_jax.rollout.pool import ExecutablePool, configure_compilation_cache
from tlt_jax.rollout.scheduler import Results, ShardRun, next_ready
from tlt_jax.rollout.shards import placed_shapes, shard_meshes
from tlt_jax.rollout.spec_step import spec_step
from tlt_jax.rollout.state import DecodeState, empty_state, needs_layers, plain_step
from tlt_jax.rollout.timeline import Timeline
from tlt_jax.rollout.weights import WeightStore
from tlt_jax.spec.controller import SpecController
from tlt_jax.spec.proposer import DraftModel, get_proposer
from tlt_jax.spec.strategy import SpecConfig
from tlt_jax.typed import typed


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """Static engine layout. `batch_buckets` must cover `max_batch` (rows per shard per wave)."""

  batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
  max_batch: int = 64
  prefill_buckets: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
  steps_per_dispatch: int = 8
  num_shards: int = 1
  tp: int = 1                    # devices per shard: tensor parallelism within a shard
  cache_slack: int = 0
  compile_cache_dir: str = ""
  precompile: bool = True        # generate() compiles its call's other programs in the background
  # The longest prompt (tokens) the engine serves. With max_new_tokens it fixes the cache and
  # context lengths of every executable, so a call's prompts never change which programs run and
  # `warm_up` can build them all before the first call. 0: sized by each call's longest prompt
  # (its prefill bucket), so a call with a new prompt bucket builds a new family of programs.
  max_prompt_len: int = 0
  # Tokens of earlier text per row (`generate`'s `corpus`) that proposers reading the rows'
  # context (`Proposer.reads_context`, e.g. suffix) may search.
  corpus_len: int = 256
  # How an EAGLE drafter follows the target. "lazy": plain steps do not run it; a speculative
  # step first feeds it what it missed, from captured hidden states (the drafter costs nothing
  # before speculation starts). "eager": every step feeds it (EAGLE-3 fused features, which are
  # not captured, always follow eagerly).
  drafter_follow: str = "lazy"
  # Attention over the KV cache (`kernels.attention`): "xla", "pallas" (a Pallas kernel that
  # reads each row's cache only up to its length, each tp device its own kv heads; interpreted
  # on CPU) or "auto" (pallas on GPU, xla elsewhere). Both give the same tokens; the cache's
  # layout follows it.
  attention: str = "auto"
  # The policy's KV cache dtype (`models/precision.py`); empty: the model's compute dtype. The
  # draft model's one-layer cache is always in the compute dtype.
  cache_dtype: str = ""

  def __post_init__(self):
    if sorted(self.batch_buckets) != list(self.batch_buckets) or self.batch_buckets[0] < 1:
      raise ValueError(f"batch_buckets must be increasing positive ints, got {self.batch_buckets}.")
    if self.max_batch > self.batch_buckets[-1]:
      raise ValueError(f"max_batch={self.max_batch} is not covered by batch_buckets "
                       f"{self.batch_buckets}; add a bucket >= {self.max_batch}.")
    if min(self.steps_per_dispatch, self.num_shards, self.tp) < 1 or self.cache_slack < 0:
      raise ValueError("steps_per_dispatch, num_shards and tp must be >= 1, cache_slack >= 0.")
    if not 0 <= self.max_prompt_len <= self.prefill_buckets[-1]:
      raise ValueError(f"max_prompt_len={self.max_prompt_len} must be in [0, the largest prefill "
                       f"bucket {self.prefill_buckets[-1]}]; add a larger prefill bucket.")
    if self.drafter_follow not in ("lazy", "eager"):
      raise ValueError(f"drafter_follow must be 'lazy' or 'eager', got {self.drafter_follow!r}.")
    if self.attention not in ("auto", *IMPLS):
      raise ValueError(f"attention must be 'auto', 'xla' or 'pallas', got {self.attention!r}.")
    if self.cache_dtype not in ("", *DTYPES):
      raise ValueError(f"cache_dtype must be '' (the compute dtype) or one of {DTYPES}, got "
                       f"{self.cache_dtype!r}.")

  @classmethod
  def from_dict(cls, d, key: str = "rollout.engine") -> "EngineConfig":
    """From a config section (`key`: where it sits, for the error messages)."""
    buckets = lambda v: tuple(int(x) for x in v)
    return typed(cls, d, key, batch_buckets=buckets, prefill_buckets=buckets)


@dataclasses.dataclass
class RolloutResult:
  """Per row (ordered by sample id): responses `[R, N]` padded after their end, log-probs of the
  processed distribution, lengths, stop reasons ('stop' | 'length'), and, when captured, the
  hidden states, still on the devices that decoded them."""

  tokens: np.ndarray
  logprobs: np.ndarray
  lengths: np.ndarray
  stop_reasons: list[str]
  hidden: CapturedHidden | None
  timeline: Timeline

  def response(self, i: int) -> list[int]:
    return self.tokens[i, : self.lengths[i]].tolist()


def bucket_for(n: int, buckets) -> int:
  for b in buckets:
    if b >= n:
      return b
  raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}.")


@dataclasses.dataclass
class _Call:
  """One `generate` call: the request, its layout, each shard's waves and the host results."""

  prompts: list[list[int]]
  rows: list[tuple[int, int]]      # (sample id, prompt index) of each row
  waves: list[list[np.ndarray]]    # each shard's waves of rows, not yet started
  params: SamplingParams
  p_bucket: int                    # the prompt bucket of every prefill
  layout: tuple                    # (cache_len, n, capture, context_len): what programs share
  corpus: dict[int, list[int]]
  keys: list[jax.Array]            # the sampling key on each shard
  out: Results
  timeline: Timeline


class RolloutEngine:
  """Generates G samples per prompt with compaction, k-step dispatches and per-device shards."""

  def __init__(self, model, config: EngineConfig, *, pad_id: int = 0, devices=None,
               spec: SpecConfig | None = None, drafter: DraftModel | None = None):
    if spec is not None and any(a.uses_drafter for a in spec.arms) and drafter is None:
      raise ValueError("SpecConfig has 'eagle' or 'tree' arms but no drafter was given to the "
                       "engine.")
    if spec is not None and config.cache_slack < spec.max_written + 1:
      config = dataclasses.replace(config, cache_slack=spec.max_written + 1)
    self.cfg = config
    self.spec = SpecController(spec, config.batch_buckets) if spec is not None else None
    names = dict.fromkeys(a.proposer for a in spec.arms if not a.is_plain) if spec else {}
    # The proposers that keep per-row state from the rows' context, in `DecodeState.proposers`.
    self.context_proposers = tuple(p for p in map(get_proposer, names) if p.reads_context)
    self.model_cfg = model.cfg
    self.pad_id = pad_id
    check_tp(model.cfg, config.tp)
    self.meshes = shard_meshes(devices if devices is not None else jax.local_devices(),
                               config.num_shards, config.tp)
    self.devices = [m.devices.flat[0] for m in self.meshes]  # where a shard's host work goes
    self.attention = resolve_impl(config.attention, self.devices[0].platform)
    self.cache_dtype = config.cache_dtype or model.cfg.dtype
    configure_compilation_cache(config.compile_cache_dir)
    self.graphdef, state = nnx.split(model)
    self.drafter = drafter
    self.dgraphdef, dstate = nnx.split(drafter.module) if drafter is not None else (None, None)
    self.lazy_follow = (drafter is not None and config.drafter_follow == "lazy"
                        and drafter.follows_lazily)
    self.weights = WeightStore(self.meshes, state, dstate, dtype=model.cfg.dtype)
    self.pool = ExecutablePool(cache_dir=config.compile_cache_dir,
                               fingerprint=self._fingerprint(self.weights.abstract(0)),
                               twins=config.num_shards > 1)

  def _fingerprint(self, state) -> str:
    """What, besides the pool key, determines a compiled program."""
    src = hashlib.sha256()
    for f in sorted(pathlib.Path(__file__).resolve().parents[1].rglob("*.py")):
      src.update(f.read_bytes())
    shapes = jax.tree.map(lambda x: (x.shape, str(x.dtype)), state)
    return "|".join([jax.__version__, repr(self.model_cfg), repr(shapes), src.hexdigest(),
                     repr(self.pad_id), repr([m.devices.tolist() for m in self.meshes]),
                     repr(self.cfg), repr(self.spec.config if self.spec else None)])

  def _merge(self, weights):
    model = nnx.merge(self.graphdef, weights[0])
    if weights[1] is None:
      return model, None
    return model, self.drafter.bind(nnx.merge(self.dgraphdef, weights[1]))

  # ------------------------------------------------------------------ executables

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

  def _empty_state(self, b: int, cache_len: int, n: int, capture: bool, ctx_len: int,
                   drafter: DraftModel | None):
    return empty_state(self.model_cfg, b, cache_len, n, capture, ctx_len, self.pad_id, drafter,
                       self.context_proposers, self.attention, self.cache_dtype)

  def _state_shape(self, b: int, cache_len: int, n: int, capture: bool, ctx_len: int):
    return jax.eval_shape(
        lambda: self._empty_state(b, cache_len, n, capture, ctx_len, self.drafter))

  def _prefill_exe(self, shard, b, u, p, cache_len, n, capture, ctx_len):
    """Prefill of `b` rows whose prompts are `u` distinct ones (`u` < `b`: the G samples of a
    prompt share one forward, and its cache rows are copied to them; `u` == `b`: one row each)."""
    key = ("prefill", shard, b, u, p, cache_len, n, capture, ctx_len)
    cfg = self.model_cfg

    def fn(weights, prompts_UxP, lens_U, src_B, ids_B, active_B, context_BxH, context_len_B):
      model, drafter = self._merge(weights)
      st = self._empty_state(b, cache_len, n, capture, ctx_len, drafter)
      shared = u < b
      rows_of = (lambda x: x[src_B]) if shared else (lambda x: x)
      cache = (kvc.init_cache(cfg, u, cache_len, self.cache_dtype, self.attention) if shared
               else st.cache)
      out = model(prompts_UxP, cache, return_layers=needs_layers(drafter))
      cache = jax.tree.map(rows_of, kvc.commit(out.cache, lens_U))
      urows, last_U = jnp.arange(u), lens_U - 1
      st = dataclasses.replace(
          st, cache=cache, logits_BxV=rows_of(out.logits_BxTxV[urows, last_U]), sample_id_B=ids_B,
          done_B=~active_B,
          captured=dataclasses.replace(st.captured, prompt_hidden_BxD=rows_of(
              out.hidden_BxTxD[urows, last_U]).astype(st.captured.prompt_hidden_BxD.dtype)),
          proposers={p.name: p.start(context_BxH, context_len_B)
                     for p in self.context_proposers})
      if drafter is not None:
        draft = drafter.init_state(cfg, u, cache_len, self.attention) if shared else st.draft
        draft = drafter.prefill(model, draft, prompts_UxP, out, lens_U)  # it reads it too
        st = dataclasses.replace(st, draft=jax.tree.map(rows_of, draft))
      return self._placed(st, shard)

    def build():
      i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)
      args = (i32(u, p), i32(u), i32(b), i32(b), jax.ShapeDtypeStruct((b,), bool),
              i32(b, ctx_len), i32(b))
      return fn, (self.weights.abstract(shard), *(self._abstract(a, shard) for a in args)), ()
    return key, build

  def _distinct(self, prompt_idx: list[int], b: int):
    """The distinct prompts of a wave's rows (first-appearance order), the bucketed count `u`
    of prefill rows, and each slot's source row; no sharing (`u` == `b`) when it saves nothing."""
    uniq = list(dict.fromkeys(prompt_idx))
    u = bucket_for(len(uniq), self.cfg.batch_buckets)
    if u >= b:
      return prompt_idx, b, np.arange(b, dtype=np.int32)
    pos = {q: j for j, q in enumerate(uniq)}
    src = np.zeros(b, np.int32)
    src[: len(prompt_idx)] = [pos[q] for q in prompt_idx]
    return uniq, u, src

  def _loop_exe(self, shard, b, cache_len, n, capture, ctx_len, params: SamplingParams, step_fn,
                name):
    """A dispatch: up to `steps_per_dispatch` applications of `step_fn` (stops when all done)."""
    key = (name, shard, b, cache_len, n, capture, ctx_len, params)
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
              self._abstract_state(self._state_shape(b, cache_len, n, capture, ctx_len), shard),
              self._abstract(jax.eval_shape(lambda: jax.random.key(0)), shard))
      return fn, args, (1,)
    return key, build

  def _decode_exe(self, shard, b, cache_len, n, capture, ctx_len, params):
    step = functools.partial(plain_step, follow=not self.lazy_follow)
    return self._loop_exe(shard, b, cache_len, n, capture, ctx_len, params, step, "decode")

  def _spec_exe(self, shard, b, cache_len, n, capture, ctx_len, params, strategy):
    step = functools.partial(spec_step, strategy=strategy, rule=self.spec.config.rule)
    return self._loop_exe(shard, b, cache_len, n, capture, ctx_len, params, step,
                          ("spec", strategy, self.spec.config.rule))

  def _compact_exe(self, shard, b_old, b_new, cache_len, n, capture, ctx_len):
    key = ("compact", shard, b_old, b_new, cache_len, n, capture, ctx_len)

    def fn(state, idx_B):
      return self._placed(jax.tree.map(lambda x: x[idx_B], state), shard)

    def build():
      args = (self._abstract_state(self._state_shape(b_old, cache_len, n, capture, ctx_len),
                                   shard),
              self._abstract(jax.ShapeDtypeStruct((b_new,), jnp.int32), shard))
      return fn, args, ()  # shapes shrink: no reuse
    return key, build

  def _twins(self, key) -> list:
    """The keys of the program `key` on the other shards: the pool moves whichever is built
    onto this shard's devices instead of compiling it again (every key is (name, shard, ...))."""
    return [(key[0], t, *key[2:]) for t in range(len(self.meshes)) if t != key[1]]

  def _get(self, key_build):
    key, build = key_build
    return self.pool.get(key, self._in_mesh(key[1], build), twins=self._twins(key))

  def _in_mesh(self, shard: int, build):
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

  # ------------------------------------------------------------------ generate

  def validate(self, prompts, group_size: int, params: SamplingParams) -> int:
    """Checks the request before any work; returns its prompt bucket."""
    if group_size < 1:
      raise ValueError(f"group_size (G) must be >= 1, got {group_size}.")
    if not prompts:
      raise ValueError("No prompts given.")
    longest = max(len(p) for p in prompts)
    if min(len(p) for p in prompts) < 1:
      raise ValueError("Every prompt needs at least one token (e.g. BOS).")
    if longest > self.cfg.prefill_buckets[-1]:
      raise ValueError(f"A prompt of {longest} tokens exceeds the largest prefill bucket "
                       f"{self.cfg.prefill_buckets[-1]}; add a larger prefill bucket.")
    if self.cfg.max_prompt_len and longest > self.cfg.max_prompt_len:
      raise ValueError(f"A prompt of {longest} tokens exceeds the engine's max_prompt_len "
                       f"{self.cfg.max_prompt_len}; raise engine.max_prompt_len (it sizes the "
                       "cache of every executable).")
    self.layout(params.max_new_tokens, longest)
    return bucket_for(longest, self.cfg.prefill_buckets)

  def layout(self, n: int, longest: int = 0) -> tuple[int, int]:
    """(cache length, context length) of the executables for `n` new tokens: fixed by
    `max_prompt_len` when it is set, else by `longest`, the call's longest prompt."""
    longest = self.cfg.max_prompt_len or longest
    p = bucket_for(longest, self.cfg.prefill_buckets)
    need = longest + n + self.cfg.cache_slack
    if need > self.model_cfg.max_seq_len:
      raise ValueError(f"Prompt of {longest} tokens + max_new_tokens {n} + slack "
                       f"{self.cfg.cache_slack} = {need} exceeds the model context "
                       f"{self.model_cfg.max_seq_len}; shorten the prompt or max_new_tokens.")
    cache_len = min(-(-(p + n + self.cfg.cache_slack) // 64) * 64, self.model_cfg.max_seq_len)
    # The rows' context (corpus, prompt), then the response, then the next token a proposer
    # drafts after; nothing when no proposer reads it.
    context_len = self.cfg.corpus_len + p + n + 1 if self.context_proposers else 0
    return max(cache_len, need), context_len

  def generate(self, prompts: list[list[int]], group_size: int, params: SamplingParams,
               key: jax.Array, *, capture_hidden: bool = False,
               corpus: dict[int, list[int]] | None = None, first_sample: int = 0,
               on_shard_idle=None) -> RolloutResult:
    """Samples `group_size` responses for every prompt; rows are ordered by sample id.

    Row `i * group_size + g` has sample id `first_sample + i * group_size + g`: a process
    generating its share of a larger request (`tlt_jax.distributed.share`) passes the sample id
    of its first row, and samples what one process generating the whole request would.

    `corpus` maps a prompt index to earlier text for that prompt (e.g. its responses in earlier RL
    steps) that the suffix proposer may draft from; it never changes what is sampled.
    `on_shard_idle(shard, device)` is called when a shard has no row left while others may still
    decode: the window where the drafter's spot trainer may use that device.
    """
    p_bucket = self.validate(prompts, group_size, params)
    n = params.max_new_tokens
    cache_len, ctx_len = self.layout(n, max(len(p) for p in prompts))
    rows = [(first_sample + i * group_size + g, i) for i in range(len(prompts))
            for g in range(group_size)]
    call = _Call(prompts, rows, self._waves(len(rows)), params, p_bucket,
                 (cache_len, n, capture_hidden or self.lazy_follow, ctx_len), corpus or {},
                 [jax.device_put(key, self.weights.sharding(s)) for s in range(len(self.meshes))],
                 Results(len(rows), n, self.model_cfg.d_model, self.pad_id, capture_hidden,
                         self.model_cfg.dtype),
                 Timeline(self.cfg.num_shards))
    built = compiles.Since()
    start = time.perf_counter()
    for s, waves in enumerate(call.waves):
      if waves:  # a shard's first wave tells which programs it will reach: build them meanwhile
        self._schedule_precompile(s, [rows[r][1] for r in waves[0]], *call.layout, params,
                                  p_bucket)
    runs = {s: self._start_wave(call, s) for s, waves in enumerate(call.waves) if waves}
    for s, run in runs.items():
      self._dispatch(call, s, run)
    while runs:
      s = next_ready(runs)
      run = self._settle(call, s, runs[s])
      if run is not None:
        runs[s] = run
        self._dispatch(call, s, run)
        continue
      del runs[s]
      call.timeline.shard_done(s, time.perf_counter())
      if on_shard_idle is not None:
        on_shard_idle(s, self.devices[s])

    out, timeline = call.out, call.timeline
    timeline.finish(time.perf_counter() - start, int(out.lengths_R.sum()), built.events,
                    built.seconds)
    if self.spec is not None:
      timeline.spec = self.spec.summary()
    reasons = ["stop" if s else "length" for s in out.stopped_R]
    return RolloutResult(out.tokens_RxN, out.logprobs_RxN, out.lengths_R, reasons, out.hidden,
                         timeline)

  def _start_wave(self, call: _Call, s: int) -> ShardRun:
    """Prefills shard `s`'s next wave (the G samples of a prompt share one prompt forward)."""
    wave = call.waves[s].pop(0)
    b = bucket_for(len(wave), self.cfg.batch_buckets)
    prefill_idx, u, src_np = self._distinct([call.rows[r][1] for r in wave], b)
    prompts_np, lens_np = pad_prompts([call.prompts[q] for q in prefill_idx], call.p_bucket,
                                      self.pad_id)
    context_np, context_len = self._contexts(call, wave, b)
    pad, upad = b - len(wave), u - len(prefill_idx)
    prompts_np = np.pad(prompts_np, ((0, upad), (0, 0)), constant_values=self.pad_id)
    lens_np = np.pad(lens_np, (0, upad), constant_values=1)
    ids_np = np.pad(np.array([call.rows[r][0] for r in wave], np.int32), (0, pad))
    active = np.arange(b) < len(wave)
    t0 = time.perf_counter()
    exe = self._get(self._prefill_exe(s, b, u, call.p_bucket, *call.layout))
    put = self.weights.sharding(s)
    st = exe(self.weights.shard(s), *[jax.device_put(x, put) for x in (
        prompts_np, lens_np, src_np, ids_np, active, context_np, context_len)])
    call.timeline.record(s, "prefill", t0, time.perf_counter(), b, len(wave))
    slot_rows = np.concatenate([wave, np.full(pad, -1)])  # row of each slot (-1: padding)
    return ShardRun(st, b, slot_rows, len(wave), np.zeros(b, np.int64), np.zeros(b, np.int64))

  def _contexts(self, call: _Call, wave, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Each slot's context for the proposers that read it: the last `corpus_len` tokens of its
    prompt's corpus, then the prompt (`[b, context_len]`, -1 past each length)."""
    width = call.layout[3]
    context_np, len_np = np.full((b, width), -1, np.int32), np.zeros(b, np.int32)
    if not width:
      return context_np, len_np
    for slot, r in enumerate(wave):
      q = call.rows[r][1]
      text = list(call.corpus.get(q, []))
      seq = text[max(len(text) - self.cfg.corpus_len, 0):] + list(call.prompts[q])
      context_np[slot, : len(seq)], len_np[slot] = seq, len(seq)
    return context_np, len_np

  def _dispatch(self, call: _Call, s: int, run: ShardRun) -> None:
    """Launches shard `s`'s next `steps_per_dispatch` steps, plain or with the arm the controller
    picks for its batch; returns without waiting for them."""
    arm = self.spec.choose(run.b, run.live) if self.spec is not None else None
    if arm is None or self.spec.is_plain(arm):
      key_build = self._decode_exe(s, run.b, *call.layout, call.params)
    else:
      key_build = self._spec_exe(s, run.b, *call.layout, call.params,
                                 self.spec.config.arms[arm])
    run.arm, run.t0 = arm, time.perf_counter()
    run.state = self._get(key_build)(self.weights.shard(s), run.state, call.keys[s])

  def _settle(self, call: _Call, s: int, run: ShardRun) -> ShardRun | None:
    """After shard `s`'s dispatch: records it, harvests finished rows and compacts the batch into
    a smaller bucket; when no row is left, starts the shard's next wave (None: no wave left)."""
    done, t_now, ss_now = (np.asarray(x) for x in jax.device_get(
        (run.state.done_B, run.state.t_B, run.state.spec.steps_B)))
    wall = time.perf_counter() - run.t0
    live_slots = np.flatnonzero(~done & (run.slots >= 0))
    emitted = int(np.sum(t_now - run.t))
    plain = run.arm is None or self.spec.is_plain(run.arm)
    kind = "decode" if plain else f"spec:{self.spec.config.arms[run.arm].name}"
    call.timeline.record(s, kind, run.t0, time.perf_counter(), run.b, run.live,
                         steps=self.cfg.steps_per_dispatch, live_after=len(live_slots),
                         tokens=emitted)
    if run.arm is not None:
      self.spec.record(run.b, run.arm, emitted, int(np.sum(ss_now - run.ss)), wall)
    run.t, run.ss = t_now, ss_now
    finished = np.flatnonzero(done & (run.slots >= 0))
    if len(live_slots) == 0:
      call.out.harvest(run.state, finished, run.slots[finished], last=True)
      kvc.check_overflow(run.state.cache)
      return self._start_wave(call, s) if call.waves[s] else None
    new_b = bucket_for(len(live_slots), self.cfg.batch_buckets)
    if new_b < run.b:
      t0 = time.perf_counter()
      call.out.harvest(run.state, finished, run.slots[finished], last=False)
      filler = np.flatnonzero(done)[0]  # a done slot: padding rows must stay done
      # One bucket down at a time (programs only for adjacent buckets): the first gather puts
      # the live rows first, each later one keeps the leading rows.
      chain = [x for x in reversed(self.cfg.batch_buckets) if new_b <= x < run.b]
      idx = np.concatenate([live_slots, np.full(chain[0] - len(live_slots), filler)])
      for b_old, b_new in zip([run.b] + chain, chain):
        step_idx = idx if b_old == run.b else np.arange(b_new)
        exe = self._get(self._compact_exe(s, b_old, b_new, *call.layout))
        run.state = exe(run.state, jax.device_put(step_idx.astype(np.int32),
                                                  self.weights.sharding(s)))
      idx = idx[:new_b]
      slots = run.slots[idx]
      slots[len(live_slots):] = -1  # padding slots: already harvested, never harvested again
      run.slots, run.b = slots, new_b
      run.t, run.ss = run.t[idx], run.ss[idx]
      call.timeline.record(s, "compact", t0, time.perf_counter(), new_b, len(live_slots))
    run.live = len(live_slots)
    return run

  def _waves(self, total: int) -> list[list[np.ndarray]]:
    """Rows of each shard's waves: shards take contiguous blocks of the `total` rows, and each
    shard processes its block in waves of at most max_batch rows."""
    blocks = np.array_split(np.arange(total), self.cfg.num_shards)
    return [[blk[i: i + self.cfg.max_batch] for i in range(0, len(blk), self.cfg.max_batch)]
            for blk in blocks]

  def _reachable(self, s, wave_prompts, p_buckets, cache_len, n, capture, ctx_len, params):
    """(key, build) of every executable shard `s` can run for waves whose rows have these prompt
    indices, with prompts in `p_buckets`: prefills, plain decoding and compaction at every bucket
    up to its widest wave, and speculative arms where they may run."""
    out, top = [], 0
    for prompt_idx in wave_prompts:
      b = bucket_for(len(prompt_idx), self.cfg.batch_buckets)
      u = self._distinct(prompt_idx, b)[1]
      top = max(top, b)
      out += [self._prefill_exe(s, b, u, p, cache_len, n, capture, ctx_len) for p in p_buckets]
    reachable = [b for b in self.cfg.batch_buckets if b <= top]
    for b in reversed(reachable):
      out.append(self._decode_exe(s, b, cache_len, n, capture, ctx_len, params))
      if self.spec is not None and self.spec.may_run(b):
        out += [self._spec_exe(s, b, cache_len, n, capture, ctx_len, params, arm)
                for arm in self.spec.config.arms if not arm.is_plain]
      smaller = [x for x in reachable if x < b]
      if smaller:  # compaction steps one bucket down at a time
        out.append(self._compact_exe(s, b, smaller[-1], cache_len, n, capture, ctx_len))
    return out

  def _schedule_precompile(self, s, first_wave, cache_len, n, capture, ctx_len, params, p_bucket):
    """Compiles, in the background, the executables this shard can reach from its first wave
    (`first_wave`: the prompt index of each of its rows) with this call's prompt bucket."""
    if not self.cfg.precompile or not first_wave:
      return
    for key_build in self._reachable(s, [first_wave], [p_bucket], cache_len, n, capture, ctx_len,
                                     params):
      self.pool.precompile(*key_build, twins=self._twins(key_build[0]))

  def warm_up(self, calls, params: SamplingParams, prompt_lengths, *,
              capture_hidden: bool = False, progress: bool = True) -> dict:
    """Builds (compiles, or loads from the caches) every executable that `generate` can run for
    these calls before the first one, so that no call compiles: `calls` are the
    `(num_prompts, group_size)` shapes the caller will use, `prompt_lengths` the lengths of the
    prompts it may pass. Needs `max_prompt_len`: without it the layout depends on the call.
    Returns the programs built and the seconds spent."""
    if not self.cfg.max_prompt_len:
      raise ValueError("warm_up needs EngineConfig.max_prompt_len (> 0): without it the cache "
                       "length follows each call's prompts and cannot be known in advance.")
    lengths = list(prompt_lengths)
    if max(lengths) > self.cfg.max_prompt_len:
      raise ValueError(f"A prompt of {max(lengths)} tokens exceeds the engine's max_prompt_len "
                       f"{self.cfg.max_prompt_len}; raise engine.max_prompt_len.")
    lo, hi = (bucket_for(f(lengths), self.cfg.prefill_buckets) for f in (min, max))
    p_buckets = [p for p in self.cfg.prefill_buckets if lo <= p <= hi]
    n = params.max_new_tokens
    cache_len, ctx_len = self.layout(n)
    capture = capture_hidden or self.lazy_follow
    keys = {}
    for num_prompts, group_size in calls:
      for s, waves in enumerate(self._waves(num_prompts * group_size)):
        wave_prompts = [[int(r) // group_size for r in wave] for wave in waves]
        for key, build in self._reachable(s, wave_prompts, p_buckets, cache_len, n, capture,
                                          ctx_len, params):
          keys[key] = build
    built = compiles.Since()
    start = time.perf_counter()
    for key, build in sorted(keys.items(), key=lambda kb: kb[0][1]):  # shard 0's twins first
      self.pool.precompile(key, build, twins=self._twins(key))
    self.pool.wait(progress=progress, desc="warm-up: rollout")
    return {"programs": len(keys), "built": built.events,
            "seconds": round(time.perf_counter() - start, 3)}
