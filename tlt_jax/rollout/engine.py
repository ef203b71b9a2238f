"""`RolloutEngine`: batched sampling whose batch shrinks into smaller buckets as rows finish.

Rows are `(prompt, sample)` pairs with sample id `i = prompt_index * G + g`; the noise of row `i`
at response position `t` is addressed (see `models/sampling.py`), by its sample id or by the
address the caller gives it (`rollout/noise.py`), so a row's tokens do not depend on which bucket,
shard or dispatch produced them.

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
import time

import jax
import numpy as np
from flax import nnx

from tlt_jax.kernels.attention import IMPLS, resolve_impl
from tlt_jax.models import kv_cache as kvc
from tlt_jax.models.precision import DTYPES
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.models.sharding import check_tp
from tlt_jax.models.transformer import token_view
from tlt_jax.rollout import compiles
from tlt_jax.rollout.captured import CapturedHidden
from tlt_jax.rollout.history import ReplayConfig
from tlt_jax.rollout.noise import PROMPT_WORDS
from tlt_jax.rollout.port import DrafterPort
from tlt_jax.rollout.programs import Layout, Programs, bucket_for
from tlt_jax.rollout.replay_choice import ReplayChoice
from tlt_jax.rollout.scheduler import (Call, Results, Scheduler, ShardRun, next_ready,
                                       row_inputs, split_waves, warm_up_waves)
from tlt_jax.rollout.shards import shard_meshes
from tlt_jax.rollout.timeline import Timeline
from tlt_jax.rollout.weights import WeightStore
from tlt_jax.spec.controller import SpecController
from tlt_jax.spec.costs import CostTable
from tlt_jax.spec.proposer import DraftModel, get_proposer
from tlt_jax.spec.strategy import SpecConfig
from tlt_jax.typed import typed


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """Static engine layout. `batch_buckets` must cover `max_batch` (rows per shard per wave)."""

  batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)  # batch sizes a call compacts to
  max_batch: int = 64            # rows per shard per wave (within the largest bucket)
  prefill_buckets: tuple[int, ...] = (16, 32, 64, 128, 256, 512)  # prompt lengths padded to
  steps_per_dispatch: int = 8    # decode or speculative steps per program launch
  num_shards: int = 1            # data-parallel rollout shards (each `tp` devices)
  tp: int = 1                    # devices per shard: tensor parallelism within a shard
  cache_slack: int = 0           # cache slots past a row's length (raised to what arms write)
  # Where compiled executables are kept across processes; empty: JAX's persistent compilation
  # cache directory where one is set (every launcher sets one: rollout/pool.use_compilation_cache),
  # else none.
  compile_cache_dir: str = ""
  # True: generate() compiles its call's other programs in the background (a trainer's warm-up
  # builds them all instead).
  precompile: bool = False
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
  # layout follows it. A policy in invariant numerics attends in its own fixed order whatever
  # this says (its drafter by this).
  attention: str = "auto"
  # The policy's KV cache dtype (`models/precision.py`); empty: the model's compute dtype. The
  # draft model's one-layer cache is always in the compute dtype.
  cache_dtype: str = ""
  # GB (1e9 bytes) per device for the policy's KV cache; 0: `max_batch` as given. Set, a run's
  # `max_batch` becomes the largest batch bucket whose cache fits (`rl.memory.sized_engine`).
  kv_cache_gb: float = 0.0

  def __post_init__(self):
    if sorted(self.batch_buckets) != list(self.batch_buckets) or self.batch_buckets[0] < 1:
      raise ValueError(f"batch_buckets must be increasing positive ints, got {self.batch_buckets}.")
    if not self.kv_cache_gb and self.max_batch > self.batch_buckets[-1]:
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
    if self.kv_cache_gb < 0:
      raise ValueError(f"kv_cache_gb must be >= 0 (0: max_batch as given), got {self.kv_cache_gb}.")
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
    """Row `i`'s response tokens, up to its length."""
    return self.tokens[i, : self.lengths[i]].tolist()


class RolloutEngine:
  """Generates G samples per prompt with compaction, k-step dispatches and per-device shards."""

  def __init__(self, model, config: EngineConfig, *, pad_id: int = 0, devices=None,
               spec: SpecConfig | None = None, drafter: DraftModel | None = None,
               costs: CostTable | None = None, replay: ReplayConfig = ReplayConfig()):
    config = _checked(config, spec, drafter, replay)
    self.cfg = config
    self.replay_chunk = replay_chunk = replay.chunk
    # "share": replay by the share of rows replaying even where `costs` could price it.
    self.replay_choice = ReplayChoice(replay_chunk,
                                      costs if replay.history.dispatch == "cost" else None)
    self.noise = replay.noise  # "prompt": `generate` takes each row's address (rollout/noise.py)
    self.words = PROMPT_WORDS if replay.noise == "prompt" else 1
    self.spec = SpecController(spec, config.batch_buckets, costs) if spec is not None else None
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
    self.drafter = drafter
    dstate = nnx.split(drafter.module)[1] if drafter is not None else None
    self.weights = WeightStore(self.meshes, nnx.split(model)[1], dstate, dtype=model.cfg.dtype)
    self.programs = Programs(model, config, self.weights, self.meshes, pad_id=pad_id,
                             drafter=drafter, context_proposers=self.context_proposers,
                             attention=self.attention, cache_dtype=self.cache_dtype,
                             spec_config=spec, words=self.words, replay_chunk=replay_chunk)
    self.pool = self.programs.pool
    self.scheduler = Scheduler(config, self.spec, self.replay_choice, self.programs.lazy_follow)
    self.token_graphdef = nnx.split(token_view(model))[0]  # what a drafter reads of the policy

  def drafter_port(self) -> DrafterPort:
    """What the drafter package may read of this engine and publish to it."""
    top = bucket_for(self.cfg.max_batch, self.cfg.batch_buckets)
    return DrafterPort(tuple(self.devices), self.model_cfg.d_model, self.model_cfg.dtype,
                       tuple(b for b in self.cfg.batch_buckets if b <= top),
                       self.token_graphdef, self.programs.dgraphdef, self.weights)

  def generate(self, prompts: list[list[int]], group_size: int, params: SamplingParams,
               key: jax.Array, *, capture_hidden: bool = False,
               corpus: dict[int, list[int]] | None = None, first_sample: int = 0,
               addresses: np.ndarray | None = None, replay: list | None = None,
               on_shard_idle=None) -> RolloutResult:
    """Samples `group_size` responses for every prompt; rows are ordered by sample id.

    Row `i * group_size + g` has sample id `first_sample + i * group_size + g`: a process
    generating its share of a larger request (`tlt_jax.distributed.share`) passes the sample id
    of its first row, and samples what one process generating the whole request would.
    `addresses` (`[rows, W]` int32, W the engine's address words) address each row's noise
    instead (`rollout/noise.py`); without them a row's address is its sample id. `replay` gives
    each row's stored response (None: none) for the replay arm (`rollout/replay.py`, on when the
    engine has a `replay_chunk`); it never changes what is sampled.

    `corpus` maps a prompt index to earlier text for that prompt (e.g. its responses in earlier RL
    steps) that the suffix proposer may draft from; it never changes what is sampled.
    `on_shard_idle(shard, device)` is called when a shard has no row left while others may still
    decode: the window where the drafter's spot trainer may use that device.
    """
    p_bucket = _validate(self.cfg, self.programs, prompts, group_size, params)
    n = params.max_new_tokens
    layout = self.programs.layout(n, capture_hidden, max(len(p) for p in prompts))
    rows = [(first_sample + i * group_size + g, i) for i in range(len(prompts))
            for g in range(group_size)]
    addresses, replay = row_inputs(len(rows), first_sample, addresses, replay, self.words,
                                   self.noise, self.replay_chunk)
    call = Call(prompts, rows, addresses, replay, split_waves(self.cfg, len(rows)), params,
                p_bucket, layout, corpus or {},
                [jax.device_put(key, self.weights.sharding(s)) for s in range(len(self.meshes))],
                Results(len(rows), n, self.model_cfg.d_model, self.pad_id, capture_hidden,
                        self.model_cfg.dtype),
                Timeline(self.cfg.num_shards))
    built = compiles.Since()
    spec_counts = self.spec.counts() if self.spec is not None else None
    start = time.perf_counter()
    for s, waves in enumerate(call.waves):
      if waves:  # a shard's first wave tells which programs it will reach: build them meanwhile
        self._schedule_precompile(s, [rows[r][1] for r in waves[0]], call.layout, params,
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
      timeline.spec = self.spec.summary(since=spec_counts)  # this call's accepted length
    reasons = ["stop" if s else "length" for s in out.stopped_R]
    return RolloutResult(out.tokens_RxN, out.logprobs_RxN, out.lengths_R, reasons, out.hidden,
                         timeline)

  def _start_wave(self, call: Call, s: int) -> ShardRun:
    """Prefills shard `s`'s next wave (`Scheduler.wave` assembles it)."""
    wave = self.scheduler.wave(call, s, self.pad_id)
    t0 = time.perf_counter()
    exe = self.programs.get(self.programs.prefill(s, wave.b, wave.u, call.p_bucket, call.layout))
    put = self.weights.sharding(s)
    st = exe(self.weights.shard(s), *[jax.device_put(x, put) for x in wave.arrays])
    call.timeline.record(s, "prefill", t0, time.perf_counter(), wave.b, len(wave.rows))
    return self.scheduler.started(wave, st)

  def _dispatch(self, call: Call, s: int, run: ShardRun) -> None:
    """Launches shard `s`'s next `steps_per_dispatch` steps, as `Scheduler.choose` says;
    returns without waiting for them."""
    d = self.scheduler.choose(run, self.pool.compiling())
    if d.kind == "replay":
      key_build = self.programs.replay(s, run.b, call.layout, call.params)
    elif d.strategy is None:
      key_build = self.programs.decode(s, run.b, call.layout, call.params)
    else:
      key_build = self.programs.speculative(s, run.b, call.layout, call.params, d.strategy,
                                            self.spec.config.rule)
    run.state = self.programs.get(key_build)(self.weights.shard(s), run.state, call.keys[s])

  def _settle(self, call: Call, s: int, run: ShardRun) -> ShardRun | None:
    """After shard `s`'s dispatch: records it, harvests finished rows and compacts the batch into
    a smaller bucket (`Scheduler.settled`, `compaction`); when no row is left, starts the shard's
    next wave (None: no wave left)."""
    synced = tuple(np.asarray(x) for x in jax.device_get(
        (run.state.done_B, run.state.t_B, run.state.spec.steps_B, run.state.replay.on_B,
         run.state.replay.emitted_B)))
    live_slots, finished = self.scheduler.settled(call, s, run, synced)
    if len(live_slots) == 0:
      call.out.harvest(run.state, finished, run.slots[finished], last=True)
      kvc.check_overflow(run.state.cache)
      return self._start_wave(call, s) if call.waves[s] else None
    c = self.scheduler.compaction(run, live_slots, synced[0])
    if c is not None:
      t0 = time.perf_counter()
      call.out.harvest(run.state, finished, run.slots[finished], last=False)
      for b_old, b_new in zip([run.b] + c.chain, c.chain):
        step_idx = c.idx if b_old == run.b else np.arange(b_new)
        exe = self.programs.get(self.programs.compact(s, b_old, b_new, call.layout))
        run.state = exe(run.state, jax.device_put(step_idx.astype(np.int32),
                                                  self.weights.sharding(s)))
      self.scheduler.compacted(run, c, len(live_slots))
      call.timeline.record(s, "compact", t0, time.perf_counter(), c.b, len(live_slots))
    run.live = len(live_slots)
    return run

  def _schedule_precompile(self, s, first_wave, layout: Layout, params, p_bucket):
    """Compiles, in the background, the executables this shard can reach from its first wave
    (`first_wave`: the prompt index of each of its rows) with this call's prompt bucket."""
    if not self.cfg.precompile or not first_wave:
      return
    for key_build in self.programs.reachable(s, [first_wave], [p_bucket], layout, params,
                                             self.spec):
      self.pool.precompile(*key_build, twins=self.programs.twins(key_build[0]))

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
    layout = self.programs.layout(n, capture_hidden)
    keys = {}
    for shards in warm_up_waves(self.cfg, calls):
      for s, wave_prompts in enumerate(shards):
        for key, build in self.programs.reachable(s, wave_prompts, p_buckets, layout, params,
                                                  self.spec):
          keys[key] = build
    built = compiles.Since()
    start = time.perf_counter()
    for key, build in sorted(keys.items(), key=lambda kb: kb[0][1]):  # shard 0's twins first
      self.pool.precompile(key, build, twins=self.programs.twins(key))
    self.pool.wait(progress=progress, desc="warm-up: rollout")
    return {"programs": len(keys), "built": built.events,
            "seconds": round(time.perf_counter() - start, 3)}


def _validate(cfg: EngineConfig, programs: Programs, prompts, group_size: int,
              params: SamplingParams) -> int:
  """Checks a `generate` request before any work; returns its prompt bucket."""
  if group_size < 1:
    raise ValueError(f"group_size (G) must be >= 1, got {group_size}.")
  if not prompts:
    raise ValueError("No prompts given.")
  longest = max(len(p) for p in prompts)
  if min(len(p) for p in prompts) < 1:
    raise ValueError("Every prompt needs at least one token (e.g. BOS).")
  if longest > cfg.prefill_buckets[-1]:
    raise ValueError(f"A prompt of {longest} tokens exceeds the largest prefill bucket "
                     f"{cfg.prefill_buckets[-1]}; add a larger prefill bucket.")
  if cfg.max_prompt_len and longest > cfg.max_prompt_len:
    raise ValueError(f"A prompt of {longest} tokens exceeds the engine's max_prompt_len "
                     f"{cfg.max_prompt_len}; raise engine.max_prompt_len (it sizes the "
                     "cache of every executable).")
  programs.layout(params.max_new_tokens, False, longest)
  return bucket_for(longest, cfg.prefill_buckets)


def cache_slack(spec: SpecConfig | None, replay_chunk: int = 0) -> int:
  """Cache slots a row needs past its last token: what any arm of `spec` writes there and a
  replay chunk, plus the bonus token's."""
  return max(spec.max_written + 1 if spec is not None else 0,
             replay_chunk + 1 if replay_chunk else 0)


def _checked(config: EngineConfig, spec: SpecConfig | None, drafter, replay: ReplayConfig
             ) -> EngineConfig:
  """The engine's options checked together; the layout with cache slack for the drafts of every
  arm and for a replay chunk."""
  replay.check_rule(spec)
  replay_chunk = replay.chunk
  if spec is not None and any(a.uses_drafter for a in spec.arms) and drafter is None:
    raise ValueError("SpecConfig has 'eagle' or 'tree' arms but no drafter was given to the "
                     "engine.")
  slack = cache_slack(spec, replay_chunk)
  if config.cache_slack < slack:
    config = dataclasses.replace(config, cache_slack=slack)
  return config
