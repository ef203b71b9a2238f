"""Measuring the cost model of speculative decoding (`spec.costs.CostTable`): c(B, T) of the
target and d(B, T) of the drafter, each a jitted step as the engine runs it less a call's own
launch and wait (the engine runs several steps a call), timed in alternating rounds so that
their ratios come from the same moments of a shared machine. `cost_table_for`
measures the cells a speculation config needs once per machine and caches them.
"""

from __future__ import annotations

import functools
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tlt_jax.drafter.model import drafter_cache
from tlt_jax.hashing import content_digest
from tlt_jax.models import kv_cache as kvc
from tlt_jax.models.precision import compute_copy
from tlt_jax.models.sampling import SamplingParams, argmax, processed_logprobs
from tlt_jax.paths import as_path, write_whole
from tlt_jax.rollout.pool import warm_concurrently
from tlt_jax.spec.costs import CostTable
from tlt_jax.spec.proposer import get_proposer
from tlt_jax.spec.strategy import SpecConfig
from tlt_jax.spec.verify import coupled_targets

_COST_PARAMS = SamplingParams(temperature=0.9)  # a sampled draft, as in the benchmarks
_MIN_STEP_SHARE = 0.1  # a step is never priced below this share of a call of it (timing noise)
_LOOP_STEPS = 7  # a call of 1 + this many steps measures a call's own cost (a dispatch runs 8)


def call_times(fn, iters: int) -> np.ndarray:
  """Seconds of `iters` calls of `fn` (after one call that compiles and warms it)."""
  fn()  # compile and warm
  times = []
  for _ in range(iters):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return np.asarray(times)


def _looped(one, first):
  """`one(carry) -> carry` applied `n` times in one program, `n` a traced argument (one program
  for every `n`): `first(*args)` is the carry after the first step."""
  def steps(n, *args):
    return jax.lax.fori_loop(1, n, lambda _, carry: one(carry), first(*args))
  return steps


def step_runner(model, batch: int, tokens: int, cache_len: int, *, prefix: int = 64,
                impl: str = "xla", params: SamplingParams | None = None):
  """A call of `n` (default 1) jitted cached steps in one program, compiled once: each `tokens`
  new tokens for each of `batch` rows over a committed prefix of `prefix` tokens, followed by a
  commit (as a decode or a verify), with attention implementation `impl` and the weights in the
  compute dtype, as the engine holds them. The cache is donated and updated in place, as in the
  engine. With `params`, the step also draws every position's sample from the processed
  distribution under its own addressed noise, as a decode step samples and a coupled verify
  checks its drafts (over the whole vocabulary at each of the `tokens` positions, which at a
  large vocabulary is a good part of a verify's cost)."""
  graphdef, state = nnx.split(model)
  state = compute_copy(state, model.cfg.dtype)
  cfg = model.cfg
  prefix_B = jnp.full((batch,), prefix, jnp.int32)
  ids_B, pos_BxT = jnp.arange(batch), prefix + jnp.broadcast_to(jnp.arange(tokens), (batch, tokens))

  @functools.partial(jax.jit, donate_argnums=2)
  def step(n, state, cache, toks):
    def one(cache):
      out = nnx.merge(graphdef, state)(toks, cache)
      cache = kvc.commit(out.cache, jnp.ones((batch,), jnp.int32))
      y = out.logits_BxTxV
      if params is not None:
        y = coupled_targets(processed_logprobs(y, params), jax.random.key(0), ids_B, pos_BxT,
                            params.greedy)
      return y, cache.replace(lengths_B=prefix_B)  # the same step every time
    return _looped(lambda carry: one(carry[1]), one)(n, cache)

  # The cache is donated: its lengths must not be the closed-over `prefix_B` itself.
  box = [kvc.init_cache(cfg, batch, cache_len, impl=impl).replace(lengths_B=prefix_B + 0)]
  toks = jnp.ones((batch, tokens), jnp.int32)

  def run(n: int = 1):
    logits, box[0] = step(n, state, box[0], toks)
    return logits
  return run


def alternating_times(runners: dict, rounds: int, iters: int) -> dict:
  """Seconds of every call of each of `runners` (name -> a compiled call), timed in `rounds`
  alternating rounds of `iters` calls each, so that all of them see the same moments of a
  shared machine; ratios of their fastest calls compare them."""
  times = {k: [] for k in runners}
  for _ in range(rounds):
    for k, run in runners.items():
      times[k].extend(call_times(run, iters))
  return {k: np.asarray(v) for k, v in times.items()}


def call_overhead(one_s: float, more_s: float, steps: int = _LOOP_STEPS) -> float:
  """Seconds a call costs beyond its step, from the fastest call of one step (`one_s`) and of
  1 + `steps` steps (`more_s`) of the same program: the call less what a step adds to it, never
  below 0. The engine launches several steps a program (`steps_per_dispatch`), so a step costs it
  what it adds to a call, not a call's own launch and wait: on an H200 a call of SmolLM2's step
  costs ~0.5 ms more than the step (docs/BENCHMARKS.md, "On a GPU"). Both minima come from the
  same alternating rounds as the cells they price, the longer call as long as a dispatch: on a
  shared CPU, minima timed at other moments than the cells' moved a step's price by ms."""
  return max(0.0, one_s - (more_s - one_s) / steps)


def drafter_step_runner(target, drafter, batch: int, tokens: int, cache_len: int, *,
                        prefix: int = 64, rule: str = "coupled"):
  """A call of `n` (default 1) draft steps in one program as the engine runs them, compiled
  once: the drafter on `tokens` new inputs per row over a committed prefix (a chain step feeds
  1, a tree level its expanded nodes), the draft head over its vocabulary on the last input, the
  processed distribution and a Gumbel-max draw, with noise over the target's vocabulary under
  `coupled` (the target's own) and over the draft vocabulary under `rejection` (an independent
  stream)."""
  tgraph, tstate = nnx.split(target)
  dgraph, dstate = nnx.split(drafter)
  prefix_B = jnp.full((batch,), prefix, jnp.int32)
  v = target.cfg.vocab_size

  @functools.partial(jax.jit, donate_argnums=3)
  def step(n, tstate, dstate, cache, toks, h, key):
    def one(cache):
      tgt, d = nnx.merge(tgraph, tstate), nnx.merge(dgraph, dstate)
      g, cache = d(tgt.embed_tokens(toks), h, cache)
      logq = processed_logprobs(d.logits(tgt, g[:, -1:])[:, 0], _COST_PARAMS)
      if rule == "coupled":
        draft = d.token_ids(argmax(logq + d.of_vocab(jax.random.gumbel(key, (batch, v)))))
      else:
        draft = d.token_ids(argmax(logq + jax.random.gumbel(key, logq.shape)))
      return draft, cache.replace(lengths_B=prefix_B)
    return _looped(lambda carry: one(carry[1]), one)(n, cache)

  box = [drafter_cache(target.cfg, batch, cache_len).replace(lengths_B=prefix_B + 0)]
  toks = jnp.ones((batch, tokens), jnp.int32)
  h = jnp.ones((batch, tokens, target.cfg.d_model), jnp.dtype(target.cfg.dtype))
  key = jax.random.key(0)

  def run(n: int = 1):
    draft, box[0] = step(n, tstate, dstate, box[0], toks, h, key)
    return draft
  return run


def needed_cells(spec: SpecConfig | None, buckets, replay_chunk: int = 0) -> tuple[set, set]:
  """The (B, T) cells of the target and of the drafter that `spec`'s arms are priced with, at
  the batch buckets up to its threshold's bucket, and with `replay_chunk` > 0 the decode and the
  replay verify (`rollout/replay_choice.py`) at every bucket in `buckets`."""
  target = {(b, t) for b in buckets for t in (1, 1 + replay_chunk)} if replay_chunk else set()
  draft = set()
  if spec is None:
    return target, draft
  top = min((b for b in buckets if b >= spec.threshold), default=max(buckets))
  for b in (b for b in buckets if b <= top):
    target.add((b, 1))
    for arm in spec.arms:
      if arm.is_plain:
        continue
      target.add((b, 1 + arm.verified(spec.rule)))
      if get_proposer(arm.proposer).uses_draft_model:
        draft |= {(b, 1 if arm.proposer == "eagle" else arm.topk), (b, arm.depth)}
  return target, draft


def measure_cost_table(target, drafter, target_cells, draft_cells, cache_len: int, *,
                       prefix: int = 64, rounds: int = 3, iters: int = 5,
                       rule: str = "coupled") -> CostTable:
  """The fastest call of each cell less the call's own cost (`call_overhead`, measured on each
  model's cheapest cell beside a call of it that runs a dispatch's steps; a cell is never priced
  below `_MIN_STEP_SHARE` of its call); each batch's cells, the target's and the drafter's
  (drafting under `rule`), timed together in alternating rounds."""
  tables, loops = {"t": {}, "d": {}}, {}
  for b in sorted({b for b, _ in target_cells | draft_cells}):
    runners = {("t", t): step_runner(target, b, t, cache_len, prefix=prefix,
                                     params=_COST_PARAMS)
               for bb, t in sorted(target_cells) if bb == b}
    runners.update({("d", t): drafter_step_runner(target, drafter, b, t, cache_len,
                                                  prefix=prefix, rule=rule)
                    for bb, t in sorted(draft_cells) if bb == b})
    warm_concurrently(list(runners.values()))  # each cell's program compiled, on every core
    for (kind, t), run in list(runners.items()):  # the smallest batch's fewest tokens come first
      if kind not in loops:
        loops[kind] = (b, t)
        runners[(kind, "loop")] = lambda run=run: run(1 + _LOOP_STEPS)
    for (kind, t), x in alternating_times(runners, rounds, iters).items():
      tables[kind][(b, t)] = float(np.min(x))
  for kind, cell in loops.items():
    overhead = call_overhead(tables[kind][cell], tables[kind].pop((cell[0], "loop")))
    tables[kind] = {k: max(s - overhead, _MIN_STEP_SHARE * s) for k, s in tables[kind].items()}
  return CostTable(tables["t"], tables["d"])


def cpu_model() -> str:
  """The processor's name (Linux: /proc/cpuinfo's `model name`), else what `platform` knows: two
  x86 machines of one kind can differ in their matrix units and caches, and so in c(B, T)."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def machine_id() -> dict:
  """What a cost table is valid for besides the model: the backend, device, processor, cores and
  jax (a cache directory kept across machines must not price one CPU with another's table)."""
  return {"backend": jax.default_backend(), "device": jax.devices()[0].device_kind,
          "cpu": cpu_model(), "cpus": os.cpu_count(), "machine": platform.machine(),
          "jax": jax.__version__}


def cost_table_for(target, drafter, spec: SpecConfig | None, buckets, cache_len: int,
                   cache_dir: str, *, replay_chunk: int = 0,
                   prefix: int = 64) -> tuple[CostTable, bool]:
  """The cost table that `spec`'s `cost` chooser and the replay choice (`replay_chunk` > 0)
  need: loaded from `cache_dir/costs` when this machine measured it for these shapes before,
  else measured (a few seconds per bucket) and cached. Returns (table, whether it was loaded)."""
  target_cells, draft_cells = needed_cells(spec, buckets, replay_chunk)
  rule = spec.rule if spec is not None else "coupled"
  dshape = None if drafter is None else (repr(drafter.cfg), drafter.target_cfg.to_dict())
  key = content_digest([machine_id(), target.cfg.to_dict(), dshape, sorted(target_cells),
                        sorted(draft_cells), cache_len, prefix, rule, "sampled", "in-dispatch"])
  path = as_path(cache_dir) / "costs" / f"{key}.json"
  if path.exists():
    return CostTable.from_json(path.read_text()), True
  if draft_cells and drafter is None:
    raise ValueError("The spec's arms draft with a drafter, but none was given to price them.")
  table = measure_cost_table(target, drafter, target_cells, draft_cells, cache_len, prefix=prefix,
                             rule=rule)
  path.parent.mkdir(parents=True, exist_ok=True)
  write_whole(path, table.to_json())
  return table, False
