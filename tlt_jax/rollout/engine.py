"""`RolloutEngine`: batched sampling whose batch shrinks into smaller buckets as rows finish.

Rows are `(prompt, sample)` pairs with sample id `i = prompt_index * G + g`; the noise of row `i`
at response position `t` is addressed (see `sampling.py`), so a row's tokens do not depend on
which bucket, shard or dispatch produced them.

Each data-parallel shard owns one device and runs its own executables (per-device, not SPMD):
shards then shrink their batches independently, and a shard whose rows are all done goes idle at
once instead of stepping in lockstep with the busiest one. That idle window is reported in the
timeline, and it is where the drafter trains.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import SingleDeviceSharding

from tlt_jax.models import kv_cache as kvc
from tlt_jax.rollout.plain import pad_prompts, prefill
from tlt_jax.rollout.pool import ExecutablePool, configure_compilation_cache
from tlt_jax.rollout.sampling import SamplingParams, sample
from tlt_jax.rollout.timeline import Timeline


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """Static engine layout. `batch_buckets` must cover `max_batch` (rows per shard per wave)."""

  batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
  max_batch: int = 64
  prefill_buckets: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
  steps_per_dispatch: int = 8
  num_shards: int = 1
  cache_slack: int = 0
  compile_cache_dir: str = ""
  precompile: bool = True

  def __post_init__(self):
    if sorted(self.batch_buckets) != list(self.batch_buckets) or self.batch_buckets[0] < 1:
      raise ValueError(f"batch_buckets must be increasing positive ints, got {self.batch_buckets}.")
    if self.max_batch > self.batch_buckets[-1]:
      raise ValueError(f"max_batch={self.max_batch} is not covered by batch_buckets "
                       f"{self.batch_buckets}; add a bucket >= {self.max_batch}.")
    if self.steps_per_dispatch < 1 or self.num_shards < 1 or self.cache_slack < 0:
      raise ValueError("steps_per_dispatch and num_shards must be >= 1, cache_slack >= 0.")

  @classmethod
  def from_dict(cls, d) -> "EngineConfig":
    d = dict(d)
    for k in ("batch_buckets", "prefill_buckets"):
      if k in d:
        d[k] = tuple(int(x) for x in d[k])
    return cls(**d)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
  """Everything one shard's decode loop carries, batch-leading: compacted as one pytree."""

  cache: kvc.KVCache
  logits_BxV: jax.Array       # next-token logits of each row
  sample_id_B: jax.Array
  t_B: jax.Array              # tokens emitted so far
  done_B: jax.Array
  stopped_B: jax.Array        # ended on a stop token (else: length)
  tokens_BxN: jax.Array
  logprobs_BxN: jax.Array
  hidden_BxNxD: jax.Array     # hidden state of each emitted token ([B, 0, D] when not captured)
  prompt_hidden_BxD: jax.Array  # hidden state of the last prompt token (it predicted token 0)


@dataclasses.dataclass
class RolloutResult:
  """Per row (ordered by sample id): responses `[R, N]` padded after their end, log-probs of the
  processed distribution, lengths, stop reasons ('stop' | 'length'), optional hidden states."""

  tokens: np.ndarray
  logprobs: np.ndarray
  lengths: np.ndarray
  stop_reasons: list[str]
  hidden: np.ndarray | None
  prompt_hidden: np.ndarray | None
  timeline: Timeline

  def response(self, i: int) -> list[int]:
    return self.tokens[i, : self.lengths[i]].tolist()


def bucket_for(n: int, buckets) -> int:
  for b in buckets:
    if b >= n:
      return b
  raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}.")


class RolloutEngine:
  """Generates G samples per prompt with compaction, k-step dispatches and per-device shards."""

  def __init__(self, model, config: EngineConfig, *, pad_id: int = 0, devices=None):
    self.cfg = config
    self.model_cfg = model.cfg
    self.pad_id = pad_id
    devices = list(devices if devices is not None else jax.devices())
    if config.num_shards > len(devices):
      raise ValueError(f"num_shards={config.num_shards} but only {len(devices)} devices are "
                       "visible (on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N).")
    self.devices = devices[: config.num_shards]
    configure_compilation_cache(config.compile_cache_dir)
    self.graphdef, state = nnx.split(model)
    self.pool = ExecutablePool()
    self._params = None
    self.set_weights(state)

  # ------------------------------------------------------------------ weights

  def set_weights(self, state) -> None:
    """Installs new weights (e.g. from a sharded trainer) on every shard's device; the compiled
    executables are reused, since their input shardings are the shards' own devices."""
    self._abstract_params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    self._params = [jax.device_put(state, SingleDeviceSharding(d)) for d in self.devices]

  # ------------------------------------------------------------------ executables

  def _abstract(self, tree, shard: int):
    sh = SingleDeviceSharding(self.devices[shard])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), tree)

  def _state_shape(self, b: int, cache_len: int, n: int, capture: bool):
    cfg = self.model_cfg
    return jax.eval_shape(lambda: self._empty_state(b, cache_len, n, capture))

  def _empty_state(self, b, cache_len, n, capture) -> DecodeState:
    cfg = self.model_cfg
    return DecodeState(
        cache=kvc.init_cache(cfg, b, cache_len), logits_BxV=jnp.zeros((b, cfg.vocab_size)),
        sample_id_B=jnp.zeros((b,), jnp.int32), t_B=jnp.zeros((b,), jnp.int32),
        done_B=jnp.ones((b,), bool), stopped_B=jnp.zeros((b,), bool),
        tokens_BxN=jnp.full((b, n), self.pad_id, jnp.int32),
        logprobs_BxN=jnp.zeros((b, n), jnp.float32),
        hidden_BxNxD=jnp.zeros((b, n if capture else 0, cfg.d_model), jnp.dtype(cfg.dtype)),
        prompt_hidden_BxD=jnp.zeros((b, cfg.d_model), jnp.dtype(cfg.dtype)))

  def _prefill_exe(self, shard, b, p, cache_len, n, capture):
    key = ("prefill", shard, b, p, cache_len, n, capture)
    graphdef, empty = self.graphdef, self._empty_state

    def fn(params, prompts_BxP, lens_B, ids_B, active_B):
      model = nnx.merge(graphdef, params)
      st = empty(b, cache_len, n, capture)
      logits, hidden, cache = prefill(model, st.cache, prompts_BxP, lens_B)
      return dataclasses.replace(st, cache=cache, logits_BxV=logits, sample_id_B=ids_B,
                                 done_B=~active_B, prompt_hidden_BxD=hidden.astype(
                                     st.prompt_hidden_BxD.dtype))

    def build():
      i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)
      args = (self._abstract_params, i32(b, p), i32(b), i32(b),
              jax.ShapeDtypeStruct((b,), bool))
      return fn, tuple(self._abstract(a, shard) for a in args), ()
    return key, build

  def _decode_exe(self, shard, b, cache_len, n, capture, params: SamplingParams):
    key = ("decode", shard, b, cache_len, n, capture, params)
    graphdef, k_steps, pad_id = self.graphdef, self.cfg.steps_per_dispatch, self.pad_id
    stop_ids = jnp.array(params.stop_tokens or (-1,), jnp.int32)

    def fn(params_, state: DecodeState, key_):
      model = nnx.merge(graphdef, params_)

      def body(carry):
        i, st = carry
        tok_B, lp_B = sample(st.logits_BxV, params, key_, st.sample_id_B, st.t_B)
        live_B = ~st.done_B
        tok_B = jnp.where(live_B, tok_B, pad_id)
        rows = jnp.arange(b)
        t_B = jnp.minimum(st.t_B, n - 1)
        tokens = st.tokens_BxN.at[rows, t_B].set(jnp.where(live_B, tok_B, st.tokens_BxN[rows, t_B]))
        logprobs = st.logprobs_BxN.at[rows, t_B].set(
            jnp.where(live_B, lp_B, st.logprobs_BxN[rows, t_B]))
        out = model(tok_B[:, None], st.cache)
        hidden = st.hidden_BxNxD
        if capture:
          h_B = out.hidden_BxTxD[:, 0].astype(hidden.dtype)
          hidden = hidden.at[rows, t_B].set(jnp.where(live_B[:, None], h_B, hidden[rows, t_B]))
        cache = kvc.commit(out.cache, live_B.astype(jnp.int32))
        new_t = st.t_B + live_B
        hit_stop = live_B & jnp.isin(tok_B, stop_ids)
        done = st.done_B | hit_stop | (new_t >= n)
        st = dataclasses.replace(
            st, cache=cache, logits_BxV=jnp.where(live_B[:, None], out.logits_BxTxV[:, 0],
                                                  st.logits_BxV),
            t_B=new_t, done_B=done, stopped_B=st.stopped_B | hit_stop, tokens_BxN=tokens,
            logprobs_BxN=logprobs, hidden_BxNxD=hidden)
        return i + 1, st

      def cond(carry):
        i, st = carry
        return (i < k_steps) & ~jnp.all(st.done_B)

      return jax.lax.while_loop(cond, body, (jnp.int32(0), state))[1]

    def build():
      args = (self._abstract_params, self._state_shape(b, cache_len, n, capture),
              jax.eval_shape(lambda: jax.random.key(0)))
      return fn, tuple(self._abstract(a, shard) for a in args), (1,)
    return key, build

  def _compact_exe(self, shard, b_old, b_new, cache_len, n, capture):
    key = ("compact", shard, b_old, b_new, cache_len, n, capture)

    def fn(state, idx_B):
      return jax.tree.map(lambda x: x[idx_B], state)

    def build():
      args = (self._state_shape(b_old, cache_len, n, capture),
              jax.ShapeDtypeStruct((b_new,), jnp.int32))
      return fn, tuple(self._abstract(a, shard) for a in args), ()  # shapes shrink: no reuse
    return key, build

  def _get(self, key_build):
    return self.pool.get(*key_build)

  # ------------------------------------------------------------------ generate

  def validate(self, prompts, group_size: int, params: SamplingParams) -> tuple[int, int]:
    """Checks the request before any work; returns (prompt bucket, cache length)."""
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
    p = bucket_for(longest, self.cfg.prefill_buckets)
    need = longest + params.max_new_tokens + self.cfg.cache_slack
    if need > self.model_cfg.max_seq_len:
      raise ValueError(f"Prompt of {longest} tokens + max_new_tokens {params.max_new_tokens} + "
                       f"slack {self.cfg.cache_slack} = {need} exceeds the model context "
                       f"{self.model_cfg.max_seq_len}; shorten the prompt or max_new_tokens.")
    cache_len = min(-(-(p + params.max_new_tokens + self.cfg.cache_slack) // 64) * 64,
                    max(self.model_cfg.max_seq_len, need))
    return p, max(cache_len, need)

  def generate(self, prompts: list[list[int]], group_size: int, params: SamplingParams,
               key: jax.Array, *, capture_hidden: bool = False) -> RolloutResult:
    """Samples `group_size` responses for every prompt; rows are ordered by sample id."""
    p_bucket, cache_len = self.validate(prompts, group_size, params)
    n = params.max_new_tokens
    rows = [(i * group_size + g, prompts[i]) for i in range(len(prompts)) for g in range(group_size)]
    total = len(rows)
    out_tokens = np.full((total, n), self.pad_id, np.int32)
    out_logp = np.zeros((total, n), np.float32)
    out_len = np.zeros(total, np.int32)
    out_stop = np.zeros(total, bool)
    d = self.model_cfg.d_model
    out_hidden = np.zeros((total, n, d), np.float32) if capture_hidden else None
    out_phidden = np.zeros((total, d), np.float32) if capture_hidden else None
    timeline = Timeline(self.cfg.num_shards, compile_events_before=len(self.pool.events))
    start = time.perf_counter()

    def harvest(st: DecodeState, slots: np.ndarray, ids: np.ndarray):
      """Copies the given rows of a shard state to the host results."""
      host = jax.device_get((st.tokens_BxN, st.logprobs_BxN, st.t_B, st.stopped_B))
      for slot, rid in zip(slots, ids):
        out_tokens[rid], out_logp[rid] = host[0][slot], host[1][slot]
        out_len[rid], out_stop[rid] = host[2][slot], host[3][slot]
      if capture_hidden:
        h, ph = jax.device_get((st.hidden_BxNxD, st.prompt_hidden_BxD))
        for slot, rid in zip(slots, ids):
          out_hidden[rid], out_phidden[rid] = h[slot], ph[slot]

    # Shards take contiguous blocks of rows; each shard processes waves of max_batch rows.
    per_shard = np.array_split(np.arange(total), self.cfg.num_shards)
    waves = [[blk[i: i + self.cfg.max_batch] for i in range(0, len(blk), self.cfg.max_batch)]
             for blk in per_shard]
    shard_state = [None] * self.cfg.num_shards
    for s in range(self.cfg.num_shards):
      self._schedule_precompile(s, len(waves[s][0]) if waves[s] else 0, cache_len, n,
                                capture_hidden, params, p_bucket)

    def start_wave(s):
      wave = waves[s].pop(0)
      b = bucket_for(len(wave), self.cfg.batch_buckets)
      prompts_np, lens_np = pad_prompts([rows[r][1] for r in wave], p_bucket, self.pad_id)
      pad = b - len(wave)
      prompts_np = np.pad(prompts_np, ((0, pad), (0, 0)), constant_values=self.pad_id)
      lens_np = np.pad(lens_np, (0, pad), constant_values=1)
      ids_np = np.pad(np.array([rows[r][0] for r in wave], np.int32), (0, pad))
      active = np.arange(b) < len(wave)
      t0 = time.perf_counter()
      exe = self._get(self._prefill_exe(s, b, p_bucket, cache_len, n, capture_hidden))
      dev = self.devices[s]
      st = exe(self._params[s], *[jax.device_put(x, dev) for x in (
          prompts_np, lens_np, ids_np, active)])
      timeline.record(s, "prefill", t0, time.perf_counter(), b, len(wave))
      slot_rows = np.concatenate([wave, np.full(pad, -1)])  # row of each slot (-1: padding)
      return {"state": st, "b": b, "slots": slot_rows, "live": len(wave)}

    for s in range(self.cfg.num_shards):
      if waves[s]:
        shard_state[s] = start_wave(s)
    key_dev = [jax.device_put(key, d) for d in self.devices]

    while any(x is not None for x in shard_state):
      launched = []
      for s, sh in enumerate(shard_state):  # dispatch every busy shard before syncing any
        if sh is None:
          continue
        exe = self._get(self._decode_exe(s, sh["b"], cache_len, n, capture_hidden, params))
        sh["t0"] = time.perf_counter()
        sh["state"] = exe(self._params[s], sh["state"], key_dev[s])
        launched.append(s)
      for s in launched:
        sh = shard_state[s]
        done = np.asarray(sh["state"].done_B)
        live_slots = np.flatnonzero(~done & (sh["slots"] >= 0))
        timeline.record(s, "decode", sh["t0"], time.perf_counter(), sh["b"], sh["live"],
                        steps=self.cfg.steps_per_dispatch, live_after=len(live_slots))
        finished = np.flatnonzero(done & (sh["slots"] >= 0))
        if len(live_slots) == 0:
          harvest(sh["state"], finished, sh["slots"][finished])
          kvc.check_overflow(sh["state"].cache)
          shard_state[s] = start_wave(s) if waves[s] else None
          if shard_state[s] is None:
            timeline.shard_done(s, time.perf_counter())
          continue
        new_b = bucket_for(len(live_slots), self.cfg.batch_buckets)
        if new_b < sh["b"]:
          t0 = time.perf_counter()
          harvest(sh["state"], finished, sh["slots"][finished])
          filler = np.flatnonzero(done)[0]  # a done slot: padding rows must stay done
          idx = np.concatenate([live_slots, np.full(new_b - len(live_slots), filler)])
          exe = self._get(self._compact_exe(s, sh["b"], new_b, cache_len, n, capture_hidden))
          sh["state"] = exe(sh["state"], jax.device_put(idx.astype(np.int32), self.devices[s]))
          slots = sh["slots"][idx]
          slots[len(live_slots):] = -1  # padding slots: already harvested, never harvested again
          sh["slots"], sh["b"] = slots, new_b
          timeline.record(s, "compact", t0, time.perf_counter(), new_b, len(live_slots))
        sh["live"] = len(live_slots)

    timeline.finish(time.perf_counter() - start, int(out_len.sum()), self.pool.events)
    reasons = ["stop" if s else "length" for s in out_stop]
    return RolloutResult(out_tokens, out_logp, out_len, reasons, out_hidden, out_phidden, timeline)

  def _schedule_precompile(self, s, rows, cache_len, n, capture, params, p_bucket):
    """Compiles, in the background, the executables this shard can reach: buckets <= its first."""
    if not self.cfg.precompile or rows == 0:
      return
    top = bucket_for(min(rows, self.cfg.max_batch), self.cfg.batch_buckets)
    reachable = [b for b in self.cfg.batch_buckets if b <= top]
    self.pool.precompile(*self._prefill_exe(s, top, p_bucket, cache_len, n, capture))
    for b in reversed(reachable):
      self.pool.precompile(*self._decode_exe(s, b, cache_len, n, capture, params))
