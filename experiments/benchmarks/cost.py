"""Cost microbenchmarks: c(B, T), the time of one model step at batch B with T tokens per row,
the same for one draft step of an EAGLE drafter, and this machine's memory-bandwidth and compute
floors. Speculative decoding pays where c(B, 1 + depth) plus the draft steps is not much more than
c(B, 1): these numbers choose its thresholds and arms."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tlt_jax.drafter.costs import alternating_times, call_times, drafter_step_runner, step_runner
from tlt_jax.spec.suffix import SuffixProposer, suffix_propose


def _median_time(fn, iters: int) -> float:
  return float(np.median(call_times(fn, iters)))


_SUM = jax.jit(jnp.sum)
_MATVEC = jax.jit(lambda w, v: v @ w)


def _read_times(mbytes: int, iters: int) -> tuple[np.ndarray, np.ndarray, int]:
  """Per-iteration seconds to read `mbytes` by a large sum and by a large matrix-vector product
  (the decode step's own pattern), and the bytes read."""
  x = jnp.ones((mbytes * 1024 * 1024 // 4,), jnp.float32)
  w, v = x.reshape(8192, -1), jnp.ones((1, 8192), jnp.float32)
  t_sum = call_times(lambda: _SUM(x), iters)
  t_mv = call_times(lambda: _MATVEC(w, v), iters)
  return t_sum, t_mv, x.nbytes


def machine_floors(mbytes: int = 512, n: int = 2048, iters: int = 5) -> dict:
  """Measured read bandwidth (GB/s: the faster of the median sum and the median matrix-vector
  product, see `_read_times`) and f32 matmul GFLOP/s."""
  t_sum, t_mv, nbytes = _read_times(mbytes, iters)
  bandwidth = nbytes / min(np.median(t_sum), np.median(t_mv)) / 1e9
  a = jnp.ones((n, n), jnp.float32)
  mm = jax.jit(lambda a: a @ a)
  t = _median_time(lambda: mm(a), iters)
  return {"bandwidth_gb_s": round(bandwidth, 2), "matmul_gflop_s": round(2 * n ** 3 / t / 1e9, 1)}


def step_against_floor(model, cache_len: int, rounds: int = 5, iters: int = 10,
                       impl: str = "xla") -> dict:
  """A decode step at batch 1, c(1, 1), against the weight-read floor (bytes of weights ÷ read
  bandwidth), the two measured in alternating rounds so that both see the same moments of a
  shared machine. Each is reported as its fastest reading (load on a shared machine only ever
  adds time, so the minimum is the least disturbed one) and as the median of its rounds'
  medians; milliseconds."""
  weights = param_bytes(model)
  floor_min, floor_med, step_min, step_med = [], [], [], []
  for _ in range(rounds):
    t_sum, t_mv, nbytes = _read_times(512, 5)
    floor_min.append(weights / nbytes * min(t_sum.min(), t_mv.min()))
    floor_med.append(weights / nbytes * min(np.median(t_sum), np.median(t_mv)))
    t_step = step_times(model, 1, 1, cache_len, iters=iters, impl=impl)
    step_min.append(t_step.min())
    step_med.append(np.median(t_step))
  ms = lambda x: round(1e3 * float(x), 2)
  return {"step_ms_b1": ms(min(step_min)), "floor_ms_b1": ms(min(floor_min)),
          "step_ms_b1_median": ms(np.median(step_med)),
          "floor_ms_b1_median": ms(np.median(floor_med)),
          "bandwidth_gb_s": round(float(weights / min(floor_min) / 1e9), 2)}


def param_bytes(model) -> int:
  return int(sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param))))


def step_times(model, batch: int, tokens: int, cache_len: int, *, prefix: int = 64,
               iters: int = 10, impl: str = "xla") -> np.ndarray:
  """Seconds of `iters` calls of one jitted cached step (see `step_runner`)."""
  return call_times(step_runner(model, batch, tokens, cache_len, prefix=prefix, impl=impl), iters)


def product_chain(model, fused: bool = True):
  """A decode step's matrix products alone, as a jitted function of (kernels, x `[B, D]`) and the
  model's own kernels: each layer's q/k/v, o and MLP projections and the LM head, chained as in
  the step (the MLP after the attention output) but with no attention, norms, rotary embedding,
  cache write or sampling. `fused=False` runs the same products on separate q, k, v, gate and up
  kernels (copies of the fused kernels' parts), the layout the model had before it fused them:
  the two compute the same function, so their times compare the layouts alone."""
  cfg = model.cfg
  g = cfg.n_heads // cfg.n_kv_heads

  def parts(w, pieces):
    """The fused kernel `[D, ..., P, X]` as one `[D, ...]` matrix, or its pieces (ranges of the
    P axis) as separate matrices."""
    if fused:
      return [w.reshape(w.shape[0], -1)]
    return [jnp.array(w[..., a:b, :].reshape(w.shape[0], -1)) for a, b in pieces]

  kernels = [(parts(blk.attn.qkv_proj.kernel[...], [(0, g), (g, g + 1), (g + 1, g + 2)]),
              blk.attn.o_proj.kernel[...],
              parts(blk.mlp.gate_up_proj.kernel[...], [(0, 1), (1, 2)]),
              blk.mlp.down_proj.kernel[...]) for blk in model.layers]
  head = model.embed.embedding[...] if cfg.tie_embeddings else model.lm_head.kernel[...].T
  b_kv, b_f = (cfg.n_kv_heads, g + 2, cfg.hd), (2, cfg.d_ff)

  @jax.jit
  def chain(kernels, head_VxD, x_BxD):
    b = x_BxD.shape[0]
    for qkv_parts, o, gate_up_parts, down in kernels:
      if fused:
        qkv = (x_BxD @ qkv_parts[0]).reshape(b, *b_kv)
        q, kv = qkv[:, :, :g].reshape(b, -1), qkv[:, :, g:].reshape(b, -1)
        gate_up = (x_BxD @ gate_up_parts[0]).reshape(b, *b_f)
        gate, up = gate_up[:, 0], gate_up[:, 1]
      else:
        q, k, v = (x_BxD @ w for w in qkv_parts)
        kv = jnp.concatenate([k, v], axis=-1)
        gate, up = (x_BxD @ w for w in gate_up_parts)
      x_BxD = x_BxD + (q + jnp.mean(kv, -1, keepdims=True)) @ o
      x_BxD = x_BxD + (jax.nn.silu(gate) * up) @ down
    return jnp.einsum("vd,bd->bv", head_VxD, x_BxD)

  return chain, (kernels, head)


def matmul_only_cost(model, batch: int, iters: int = 10, fused: bool = True) -> float:
  """Median seconds of `product_chain` for `batch` rows of one token. It splits c(B, 1) into
  what XLA:CPU's matrix-vector products cost against the weight-read floor, and what the rest of
  the step adds on top."""
  chain, args = product_chain(model, fused)
  x = jnp.ones((batch, model.cfg.d_model), jnp.dtype(model.cfg.dtype))
  return _median_time(lambda: chain(*args, x), iters)


def cost_table(model, batches, tokens, cache_len: int, iters: int = 10, rounds: int = 3,
               impl: str = "xla", params=None) -> list[dict]:
  """c(B, T) for every pair, in milliseconds, with the per-row-token cost (with `params`, each
  step also samples its T positions, `step_runner`).

  The cells of one batch are timed together (`alternating_times`, every step compiled once),
  and each cell reports its fastest call (`ms`: load on a shared machine only ever adds time)
  and its median (`ms_median`). Their ratios, which choose what speculation can pay, then come
  from the same moments of the machine, not from cells measured minutes apart."""
  rows = []
  for b in batches:
    times = alternating_times({t: step_runner(model, b, t, cache_len, impl=impl, params=params)
                               for t in tokens}, rounds, iters)
    for t in tokens:
      c, med = float(np.min(times[t])), float(np.median(times[t]))
      rows.append({"B": b, "T": t, "ms": round(1e3 * c, 3), "ms_median": round(1e3 * med, 3),
                   "us_per_token": round(1e6 * c / (b * t), 2)})
  return rows


def speculation_bound(table: list[dict], draft_share: dict[int, float],
                      target_speedup: float = 1.8) -> list[dict]:
  """What speculation must accept to pay, from measured costs alone.

  For each batch B and chain depth k = T - 1 of the c(B, T) `table` (rows of `cost_table`): a
  speculative step verifies k drafts in one forward, c(B, 1 + k), after k draft steps of
  d(B) = `draft_share[B]` x c(B, 1) each (a model-free proposer costs none), and emits `a` tokens
  per row (accepted drafts plus the bonus token), where plain decoding emits one per c(B, 1). So
  its speedup is a c(B, 1) / (c(B, 1 + k) + k d(B)). Reported per row: `verify_x` =
  c(B, 1 + k) / c(B, 1), `draft_x` = d(B) / c(B, 1), the accepted length `target_speedup` needs
  with a model-free
  proposer and with the drafter (attainable only up to k + 1), and each one's ceiling, the
  speedup when every draft is accepted. The drafter's catching up on kept tokens and the host's
  work are left out, so the needs are lower bounds and the ceilings upper bounds.
  """
  c1 = {r["B"]: r["ms"] for r in table if r["T"] == 1}
  rows = []
  for r in table:
    b, k = r["B"], r["T"] - 1
    if k < 1 or b not in c1:
      continue
    verify = r["ms"]
    draft = draft_share[b] * c1[b] if b in draft_share else None
    row = {"B": b, "depth": k, "max_accept": k + 1, "verify_x": round(verify / c1[b], 3),
           "accept_needed_free": round(target_speedup * verify / c1[b], 2),
           "ceiling_free": round((k + 1) * c1[b] / verify, 3)}
    if draft is not None:
      spec_ms = verify + k * draft
      row.update(draft_x=round(draft / c1[b], 3),
                 accept_needed_drafter=round(target_speedup * spec_ms / c1[b], 2),
                 ceiling_drafter=round((k + 1) * c1[b] / spec_ms, 3))
    rows.append(row)
  return rows


def drafter_cost_table(target, drafter, batches, tokens, cache_len: int, iters: int = 10,
                       rounds: int = 3) -> list[dict]:
  """Draft-step cost for every (B, T) pair, in milliseconds (fastest call), timed together with
  the target's decode step at the same batch (`alternating_times`); `target_ms` is that step's
  fastest
  call in the same rounds and `share` = ms / target_ms, the draft step as a fraction of c(B, 1)
  measured at the same moments of the machine."""
  rows = []
  for b in batches:
    runners = {t: drafter_step_runner(target, drafter, b, t, cache_len) for t in tokens}
    runners["target"] = step_runner(target, b, 1, cache_len)
    times = alternating_times(runners, rounds, iters)
    del runners  # each holds a cache
    target_s = float(np.min(times["target"]))
    for t in tokens:
      d = float(np.min(times[t]))
      rows.append({"B": b, "T": t, "ms": round(1e3 * d, 3), "target_ms": round(1e3 * target_s, 3),
                   "share": round(d / target_s, 3)})
  return rows


def suffix_runner(batch: int, depth: int, ngram: int, history_len: int):
  """A call of the suffix proposer's work in one speculative step, compiled once: the match of
  each row's last `ngram` tokens over a `history_len`-token history filled half-way (its
  comparisons do not depend on the tokens), the `depth` drafts, and the history's update with
  the kept tokens."""
  proposer = SuffixProposer()
  rng = np.random.default_rng(0)
  hist_BxH = jnp.asarray(rng.integers(0, 64, (batch, history_len)), jnp.int32)
  len_B = jnp.full((batch,), history_len // 2, jnp.int32)

  @jax.jit
  def step(hist_BxH, len_B):
    drafts_BxK = suffix_propose(hist_BxH, len_B, depth, ngram)
    h = proposer.after_emit(proposer.start(hist_BxH, len_B), drafts_BxK,
                            jnp.full((batch,), depth + 1, jnp.int32))
    return drafts_BxK, h.tokens_BxH

  return lambda: step(hist_BxH, len_B)


def suffix_cost_table(target, batches, depth: int, ngram: int, history_len: int,
                      cache_len: int, iters: int = 10, rounds: int = 3) -> list[dict]:
  """The suffix proposer's work per speculative step (`suffix_runner`) at each batch, timed in
  alternating rounds with the target's decode step at that batch: milliseconds (fastest call)
  and `share`, its fraction of c(B, 1); `speculation_bound`'s model-free proposer prices it 0."""
  rows = []
  for b in batches:
    runners = {"suffix": suffix_runner(b, depth, ngram, history_len),
               "target": step_runner(target, b, 1, cache_len)}
    times = alternating_times(runners, rounds, iters)
    del runners
    s, target_s = float(np.min(times["suffix"])), float(np.min(times["target"]))
    rows.append({"B": b, "depth": depth, "ngram": ngram, "history": history_len,
                 "ms": round(1e3 * s, 4), "target_ms": round(1e3 * target_s, 3),
                 "share": round(s / target_s, 4)})
  return rows
