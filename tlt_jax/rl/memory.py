"""A run's memory per device, planned from abstract shapes only (no weights, no dataset, no device
of the recipe's kind): what a layout needs before anything is allocated.

The busiest device of a run holds a share of the update (parameters, AdamW's two moments and the
accumulated gradient, each split over the update mesh's `fsdp x tp` as `models/sharding.py`
lays them out), one rollout shard's share (the policy's compute-dtype copy and KV cache split
over the shard's `tp`), the drafter, and the temporaries of the update's and decode's programs.
Parameter bytes are exact (`nnx.eval_shape` of the model, sharded by its logical axes); the
temporaries are estimates whose formulas are written beside each row of the plan:

- update activations, per layer and token of a micro-batch's rows on one device, in the compute
  dtype: `6D + (2NH + 2KH + 3F) / tp` without rematerialisation, the layer's input `D` only
  with `remat = "full"` and `D + (2NH + 2KH + 3F) / tp` with `"dots"` (the weight matmuls'
  outputs); plus, for the layer being differentiated, its attention scores, probabilities and
  their gradient (`3 x N / tp x T^2` float32 per row: XLA's attention materialises them) and,
  without remat, the same for every layer; plus the head's logits, log-softmax and their
  gradient (`3 x T x V / tp` float32 per row).
- a micro-batch's gradient, before it is added to the accumulated one.
- decode temporaries: the logits, the processed distribution and the noise of a full batch
  (`3 x max_batch x V` float32), and one layer's scores over the cache.
- an adaptive drafter's data: its buffer's ring of hidden states (`buffer.max_tokens x D`) and
  a rollout's captured ones until the buffer takes them, `N + 1` per row (the response and the
  last prompt token) of each batch a shard harvests, which is each wave's batch at every bucket
  it compacts through (`rollout/captured.py`); both in the compute dtype.
- with several processes whose rollout shards are not the update's devices, the policy is
  gathered whole on each process's first device before it is placed (`rollout/weights.py`): its
  full parameter bytes are counted there. Otherwise it is resharded and never whole.

Without remat these are within 1.5x of the temporaries XLA reports for the update's program on
CPU (`memory_analysis()`, `tests/rl/test_memory.py`); the rows under remat are not compared.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax.numpy as jnp
from flax import nnx

from tlt_jax.drafter.model import DrafterConfig, init_drafter
from tlt_jax.errors import ConfigError
from tlt_jax.models.config import SHAPES, ModelConfig
from tlt_jax.models.sharding import FSDP, TP, logical_axes, mesh_devices, spec
from tlt_jax.models.transformer import abstract_model, token_state
from tlt_jax.rl.trainer import LoopConfig
from tlt_jax.rollout.engine import EngineConfig
from tlt_jax.rollout.programs import cache_length

GB = 1e9


@dataclasses.dataclass(frozen=True)
class PlanTarget:
  """What a run is planned for (`config.plan`): the model `shape` (a `models.config.SHAPES`
  name; empty: the run's own model), `processes` x `devices` per process, and each device's
  memory `device_gb` (GB, 1e9 bytes)."""

  shape: str = ""          # a `models.config.SHAPES` name (empty: the run's own model)
  processes: int = 1       # processes of the run
  devices: int = 1         # devices per process
  device_gb: float = 80.0  # each device's memory, GB (1e9 bytes)

  def __post_init__(self):
    if min(self.processes, self.devices) < 1 or self.device_gb <= 0:
      raise ValueError(f"processes and devices must be >= 1 and device_gb > 0, got {self}.")
    if self.shape and self.shape not in SHAPES:
      raise ValueError(f"shape {self.shape!r} is not one of {sorted(SHAPES)}.")


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
  """Bytes per device of the busiest device, by part: `rows` of (part, bytes, how computed),
  against `limit_bytes`."""

  rows: tuple[tuple[str, float, str], ...]
  limit_bytes: float

  @property
  def total_bytes(self) -> float:
    """Everything the busiest device holds at once."""
    return float(sum(b for _, b, _ in self.rows))

  @property
  def fits(self) -> bool:
    """Whether the total is within the device's memory."""
    return self.total_bytes <= self.limit_bytes

  def table(self) -> str:
    """The plan as a Markdown table, the total and the limit last."""
    lines = ["| part | GB per device | how |", "|---|---|---|"]
    lines += [f"| {name} | {b / GB:.2f} | {how} |" for name, b, how in self.rows]
    lines.append(f"| **total** | **{self.total_bytes / GB:.2f}** | of {self.limit_bytes / GB:.1f} "
                 f"GB: {'fits' if self.fits else 'does not fit'} |")
    return "\n".join(lines)

  def summary(self) -> dict:
    """Per-device figures in GB and `fits` (computed, not measured); `limit_gb` is null where
    the device reports no limit."""
    return {"gb_per_device": {name: round(b / GB, 3) for name, b, _ in self.rows},
            "total_gb": round(self.total_bytes / GB, 3),
            "limit_gb": round(self.limit_bytes / GB, 3) if math.isfinite(self.limit_bytes)
                        else None, "fits": self.fits,
            "computed": True}


def sharded_bytes(state, mesh_shape: dict, dtype=None) -> float:
  """Bytes per device of an abstract parameter state laid out by its logical axes on a mesh of
  `mesh_shape` (axis -> size); `dtype`: the bytes of that dtype instead of the leaves' own."""
  total = 0.0
  for _, v in nnx.to_flat_state(state):
    shape = tuple(v.get_value().shape)
    split = math.prod(mesh_shape.get(a, 1) for a in spec(logical_axes(v), shape, mesh_shape)
                      if a is not None)
    width = jnp.dtype(dtype or v.get_value().dtype).itemsize
    total += math.prod(shape) * width / split
  return total


def _activations(cfg: ModelConfig, rows: float, tokens: int, tp: int, remat: str,
                 width: int) -> tuple[float, str]:
  """The update's activation bytes for `rows` rows of `tokens` on one device (module docstring)."""
  d, heads = cfg.d_model, (2 * cfg.n_heads * cfg.hd + 2 * cfg.n_kv_heads * cfg.hd + 3 * cfg.d_ff)
  per_token = {"none": 6 * d + heads / tp, "dots": d + heads / tp, "full": d}[remat]
  # float32 scores, probabilities and, in the backward pass, their gradient, per row
  scores = 3 * cfg.n_heads / tp * tokens ** 2 * 4
  layers_with_scores = cfg.n_layers if remat == "none" else 1
  head = 3 * tokens * cfg.vocab_size / tp * 4
  total = rows * (cfg.n_layers * tokens * per_token * width + layers_with_scores * scores + head)
  return total, (f"{rows:g} row(s) x {tokens} tokens, remat={remat}: per layer and token "
                 f"{per_token:.0f} x {width} B, scores of {layers_with_scores} layer(s), logits")


def plan_memory(cfg: ModelConfig, loop: LoopConfig, engine: EngineConfig, *, param_dtype: str,
                compute_dtype: str, prompt_len: int, max_new_tokens: int, target: PlanTarget,
                drafter: DrafterConfig | None = None, buffer_tokens: int = 0) -> MemoryPlan:
  """The busiest device's memory for a run of model `cfg` with these settings on `target`; an
  adaptive drafter holds a buffer of `buffer_tokens` hidden states (0: none)."""
  abstract = abstract_params(cfg.replace(param_dtype=param_dtype))
  data, fsdp, tp = planned_mesh(loop.mesh_shape, target)
  update = {FSDP: fsdp, TP: tp}
  master = sharded_bytes(abstract, update)
  width = jnp.dtype(compute_dtype).itemsize
  rows_per_device = (loop.prompts_per_step * loop.group_size
                     / (loop.mini_batches * loop.micro_batches * data * fsdp))
  tokens = prompt_len + max_new_tokens
  if loop.max_tokens_per_micro_batch:  # its tokens at the widest rows: a bound at every width
    rows_per_device = min(rows_per_device, loop.max_tokens_per_micro_batch / tokens)
  act, act_how = _activations(cfg, rows_per_device, tokens, tp, loop.remat, width)
  shard = {TP: engine.tp}
  # the pallas layout: the larger of the two, so the plan bounds either
  cache_len = cache_length(engine, cfg.max_seq_len, prompt_len, max_new_tokens, "pallas")
  engine = sized_engine(engine, cfg, cache_len, compute_dtype)
  kv = engine.max_batch * kv_bytes_per_row(cfg, engine, cache_len, compute_dtype)
  decode = engine.max_batch * (3 * cfg.vocab_size * 4 + cfg.n_heads / engine.tp * cache_len * 4)
  rows = [
      ("parameters", master, f"{param_dtype}, split over fsdp={fsdp} x tp={tp}"),
      ("optimizer state", 2 * master, "AdamW's two moments, laid out as the parameters"),
      ("gradients", master, "one accumulated gradient, laid out as the parameters"),
      ("micro-batch gradient", master, "a micro-batch's gradient before it is added"),
      ("update activations", act, act_how),
      ("rollout weights", sharded_bytes(abstract, shard, compute_dtype),
       f"{compute_dtype} copy, split over the shard's tp={engine.tp}"),
      ("KV cache", kv, f"{engine.max_batch} rows x {cache_len} slots x {cfg.n_layers} layers, "
                       f"k and v, {cfg.n_kv_heads} kv heads / tp={engine.tp}"),
      ("decode temporaries", decode, "logits, processed distribution and noise; one layer's "
                                     "scores over the cache"),
  ]
  if drafter is not None:
    head = nnx.state(nnx.eval_shape(lambda: init_drafter(cfg, drafter)), nnx.Param)
    own = sharded_bytes(head, {}, "float32")
    # The target's embedding and head it reads are the rollout's own copy on a shard of one
    # device; a tp split of the vocabulary is gathered whole onto the shard's first device.
    tokens = sharded_bytes(token_state(abstract), {}, compute_dtype) if engine.tp > 1 else 0
    rows.append(("drafter", 4 * own + engine.max_batch * cache_len * 2 * cfg.n_kv_heads * cfg.hd
                 * width + tokens,
                 "its own weights with AdamW and a gradient (float32), its one-layer cache"
                 + (f", and the target's embedding and head whole ({compute_dtype}; tp="
                    f"{engine.tp} splits them)" if engine.tp > 1 else "")))
  if buffer_tokens:
    hidden = cfg.d_model * width
    rows_per_shard = -(-loop.prompts_per_step * loop.group_size
                       // (target.processes * engine.num_shards))
    waves = -(-rows_per_shard // engine.max_batch)
    harvested = waves * sum(b for b in engine.batch_buckets if b <= engine.max_batch)
    rows.append(("drafter data", (buffer_tokens + harvested * (max_new_tokens + 1)) * hidden,
                 f"the adaptive drafter's buffer of {buffer_tokens} hidden states and a "
                 f"rollout's captured ones, {compute_dtype}: {waves} wave(s) of a shard, each "
                 f"harvested at every batch bucket it compacts through"))
  if target.processes > 1 and (data * fsdp * tp != target.processes * target.devices
                               or engine.num_shards * engine.tp != target.devices):
    rows.append(("gathered policy", sharded_bytes(abstract, {}),
                 "the rollout shards are not the update's devices: the whole policy on each "
                 "process's first device (rollout/weights.py)"))
  return MemoryPlan(tuple(rows), target.device_gb * GB)


@functools.lru_cache(maxsize=8)
def abstract_params(cfg: ModelConfig):
  """The shapes of model `cfg`'s parameters (a state of `jax.ShapeDtypeStruct`s), traced once per
  shape: tracing a 28-layer model's construction takes seconds."""
  return nnx.state(abstract_model(cfg), nnx.Param)


def planned_mesh(mesh_shape: tuple[int, ...], target: PlanTarget) -> tuple[int, int, int]:
  """The `(data, fsdp, tp)` sizes `mesh_shape` takes over `target`'s devices (a -1 resolved), or
  a `ConfigError` where they cannot hold it (`models.sharding.mesh_devices`)."""
  shape = tuple(mesh_shape) + (1,) * (3 - len(mesh_shape))
  try:
    return mesh_devices(shape, [list(range(target.devices))] * target.processes).shape
  except ValueError as e:
    raise ConfigError(f"config.train.mesh_shape={tuple(mesh_shape)} on {target.processes} "
                      f"process(es) x {target.devices} device(s): {e}") from None


def kv_bytes_per_row(cfg: ModelConfig, engine: EngineConfig, cache_len: int,
                     compute_dtype: str) -> float:
  """One row's policy KV cache on one device of a rollout shard: k and v of every layer over
  `cache_len` slots, the kv heads split over the shard's `tp`, in the cache dtype."""
  width = jnp.dtype(engine.cache_dtype or compute_dtype).itemsize
  return cache_len * cfg.n_layers * 2 * (cfg.n_kv_heads / engine.tp) * cfg.hd * width


def sized_engine(engine: EngineConfig, cfg: ModelConfig, cache_len: int,
                 compute_dtype: str) -> EngineConfig:
  """`engine` with `max_batch` the largest batch bucket whose KV cache fits `kv_cache_gb` (as
  given where that is 0); a one-line error where even the smallest bucket does not fit."""
  if not engine.kv_cache_gb:
    return engine
  row = kv_bytes_per_row(cfg, engine, cache_len, compute_dtype)
  fitting = [b for b in engine.batch_buckets if b * row <= engine.kv_cache_gb * GB]
  if not fitting:
    raise ConfigError(
        f"config.rollout.engine.kv_cache_gb={engine.kv_cache_gb:g} holds no batch bucket: one "
        f"row's KV cache ({cache_len} slots) is {row / GB:.3g} GB and the smallest bucket has "
        f"{engine.batch_buckets[0]} row(s); raise kv_cache_gb, or lower rollout.max_new_tokens "
        "or the prefill buckets.")
  return dataclasses.replace(engine, max_batch=fitting[-1])


def device_limit_bytes(device) -> float | None:
  """The memory a device reports it can allocate (`memory_stats()["bytes_limit"]`), or None
  where the backend reports none (CPU)."""
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  return float(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None

