"""The RL loop: prompts -> rollout (engine, optionally speculative) -> rewards -> update ->
weight sync -> (optionally) the adaptive drafter's spot training and checked publishing; around
the step, hooks (`rl/hooks.py`) evaluate, checkpoint (orbax) and export, and one writer
(`rl/metrics.py`) keeps the JSONL + TensorBoard metrics and a per-step rollout record. The
algorithm is a learner (`rl.learner`: GRPO, GSPO); its metrics are logged under its name
(`grpo/loss`).

`baseline` and `tlt` runs are the same loop; `tlt` only adds speculative decoding to the rollout
engine. With the `coupled` rule the rollouts, and so the whole run, are identical.

Run directory: `metrics.jsonl` (one record per step), `rollouts.jsonl` (every engine dispatch of
each step's rollout: the shrinking batch, speculation), `tb/` (TensorBoard), `checkpoints/`.
Everything a step draws is addressed by the step (prompts, sampling keys), so a run resumed from
the checkpoint of step s continues the trajectory of a run that was never stopped.

Several processes (`tlt_jax.distributed`) run the same loop: each generates its share of a step's
prompts on its own devices (the sample ids, and so the tokens, are those of one process
generating them all), the rows are gathered on every process, the update's mesh spans the
processes, and the new policy reaches each process's rollout devices by one all-gather. Only
process 0 writes the run's files; every process writes and restores its part of the checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from tlt_jax import distributed
from tlt_jax.checkpoint import Checkpointer
from tlt_jax.errors import ConfigError, TrainingError
from tlt_jax.drafter.adaptive import AdaptiveDrafter
from tlt_jax.drafter.proposer import as_proposer
from tlt_jax.models.sharding import make_mesh
from tlt_jax.models.transformer import REMAT_POLICIES
from tlt_jax.paths import as_path
from tlt_jax.rl import resume
from tlt_jax.rl.hooks import loop_hooks
from tlt_jax.rl.learner import Learner
from tlt_jax.rl.metrics import RunWriter, check_loggers, rollout_record, step_metrics
from tlt_jax.rl.samples import Samples, select_groups
from tlt_jax.rl.update import OptimConfig, PolicyBatch, PolicyUpdater, rollout_update
from tlt_jax.rollout import compiles
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.rollout.history import PromptMemory, ReplayConfig
from tlt_jax.rollout.programs import bucket_for
from tlt_jax.rollout.spread import Spread, generate_spread, warm_up_spread
from tlt_jax.spec.strategy import SpecConfig

_UPDATE_ORDER = 1_000_033  # with (seed, step): the update's shuffle of a batch into mini-batches
_PROMPT_NOISE = 1_000_037  # the run's key under prompt-addressed noise (the same every step)


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """The loop's own settings: each step draws `prompts_per_step` prompts x `group_size` samples
  (addressed by `seed` and the step) for `steps` steps; the update makes `update_epochs` passes
  over a step's rows, each cut into `mini_batches` (one optimizer step each), and accumulates each
  mini-batch's gradient over `micro_batches` (or, with `max_tokens_per_micro_batch` > 0,
  length-sorted groups of at most that many tokens per device) on a `mesh_shape` = (data, fsdp) or
  (data, fsdp, tp) mesh over the devices of every process (one axis may be -1: every device left;
  `models.sharding.mesh_devices`), keeping of each layer for the backward pass what `remat` says
  (`models/transformer.REMAT_POLICIES`); held-out evaluation every `eval_every` steps (0: off)
  with `eval_group_size` samples per prompt; a checkpoint every `checkpoint_every` steps (0: off),
  the last `keep` kept; `export` the final policy (and drafter) to `out_dir/export`, and every
  `export_every` steps (0: off) to `out_dir/export/step_<N>`; step metrics go to
  `out_dir/metrics.jsonl` and to `loggers` (`tensorboard`, `wandb`). `resume`: a launch into a
  run directory of the same settings goes on from its latest checkpoint; False moves that run
  aside and starts afresh (`rl/rundir.py`)."""

  out_dir: str
  steps: int                     # RL steps
  prompts_per_step: int          # prompts drawn per step
  group_size: int                # samples per prompt
  seed: int = 0
  micro_batches: int = 1         # gradient accumulation groups per mini-batch
  max_tokens_per_micro_batch: int = 0  # or groups of at most this many tokens per device
  mini_batches: int = 1          # optimizer steps per pass over a step's rows
  update_epochs: int = 1         # passes over a step's rows
  mesh_shape: tuple[int, ...] = (-1, 1, 1)  # the update's (data, fsdp[, tp]) mesh; -1: the rest
  remat: str = "none"            # what the backward pass keeps: none | dots | full
  checkpoint_every: int = 0      # steps between checkpoints (0: off)
  keep: int = 2                  # checkpoints kept
  eval_every: int = 0            # steps between held-out evaluations (0: off)
  eval_group_size: int = 4       # samples per held-out prompt
  export: bool = False           # the final policy (and drafter) to out_dir/export
  export_every: int = 0          # and every so many steps to out_dir/export/step_<N> (0: off)
  loggers: tuple[str, ...] = ("tensorboard",)  # beside metrics.jsonl: tensorboard, wandb
  resume: bool = True            # False: move an earlier run in out_dir aside, start afresh

  def __post_init__(self):
    for name in ("steps", "prompts_per_step", "group_size", "micro_batches", "mini_batches",
                 "update_epochs"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}.")
    mesh = tuple(self.mesh_shape)
    if (len(mesh) not in (2, 3) or mesh.count(-1) > 1
        or any(not isinstance(m, int) or (m < 1 and m != -1) for m in mesh)):
      raise ValueError(f"mesh_shape must be (data, fsdp) or (data, fsdp, tp) with integers >= 1 "
                       f"and at most one -1 (every device left), got {mesh}.")
    if self.max_tokens_per_micro_batch < 0 or (self.max_tokens_per_micro_batch
                                               and self.micro_batches > 1):
      raise ValueError(f"max_tokens_per_micro_batch must be >= 0 (0: micro_batches sets the "
                       f"micro-batches) and micro_batches 1 when it is set, got "
                       f"{self.max_tokens_per_micro_batch} and {self.micro_batches}.")
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"remat must be one of {', '.join(REMAT_POLICIES)}, got {self.remat!r}.")
    if min(self.checkpoint_every, self.eval_every, self.export_every) < 0 or self.keep < 1:
      raise ValueError("checkpoint_every, eval_every and export_every must be >= 0 (0: off), "
                       "keep >= 1.")
    check_loggers(self.loggers, self.out_dir)


def check_split(what: str, n: int) -> None:
  """A one-line error where `n` prompts (the setting `what`) do not split evenly over the
  processes: each generates an equal share."""
  procs = jax.process_count()
  if n % procs:
    raise ConfigError(f"{what}={n} does not split evenly over the {procs} processes (each "
                      f"generates an equal share); use a multiple of {procs}.")


def check_layout(loop: LoopConfig, engine_cfg: EngineConfig, pool: list, eval_prompts):
  """The update's mesh and the prompts' prefill bucket; raises a one-line error where the
  loop's layout does not fit the prompts, the processes or the devices."""
  rows = loop.prompts_per_step * loop.group_size
  if loop.prompts_per_step > len(pool):
    raise ValueError(f"prompts_per_step={loop.prompts_per_step} exceeds the prompt pool "
                     f"({len(pool)}); raise num_prompts or lower prompts_per_step.")
  check_split("loop.prompts_per_step", loop.prompts_per_step)
  check_split("eval_prompts", len(eval_prompts or []))
  longest = max(len(p) for p in pool)
  try:
    bucket = bucket_for(longest, engine_cfg.prefill_buckets)
  except ValueError:
    raise ValueError(f"The longest prompt ({longest} tokens) exceeds every prefill bucket "
                     f"{engine_cfg.prefill_buckets}; add a larger bucket to "
                     "engine.prefill_buckets.") from None
  try:  # the layouts against the devices this process has: a bad one is a config error
    mesh = make_mesh(*loop.mesh_shape)
  except ValueError as e:
    raise ConfigError(f"config.train.mesh_shape={tuple(loop.mesh_shape)}: {e}") from None
  split = loop.mini_batches * loop.micro_batches * mesh.devices.size
  if loop.max_tokens_per_micro_batch:  # the update pads its groups to the devices
    split = loop.mini_batches
  if rows % split:
    raise ConfigError(
        f"config.train: prompts_per_step x group_size = {rows} rows do not split into "
        f"{loop.mini_batches} mini-batch(es) of {loop.micro_batches} micro-batch(es) over the "
        f"update's {mesh.devices.size} devices (mesh_shape {tuple(loop.mesh_shape)} = "
        f"{tuple(mesh.devices.shape)} over {jax.process_count()} process(es)); use a multiple "
        f"of {split} rows.")
  return mesh, bucket


class Trainer:
  """One RL run of `loop`'s settings with `learner`'s algorithm on `workload`'s prompts (or
  `prompt_pool` with `answers`); `eval_prompts` (with answers) are scored every
  `loop.eval_every` steps, at step 0 and at the end (`eval/accuracy`, the response lengths'
  percentiles and the fraction of groups with mixed rewards: the task's properties for this
  policy). `costs`: the cost table of `spec.chooser = "cost"`; `replay`: how the rollout's
  noise is addressed and whether earlier responses are stored and replayed; `settings_digest`:
  the run's settings (`rl/rundir.py`), kept in its checkpoints, which resume no other."""

  def __init__(self, workload, loop: LoopConfig, *, engine_cfg: EngineConfig, learner: Learner,
               optim: OptimConfig, spec: SpecConfig | None = None, drafter=None, adaptive=None,
               prompt_pool: list | None = None, answers: list | None = None,
               eval_prompts: list | None = None, eval_answers: list | None = None,
               costs=None, replay: ReplayConfig = ReplayConfig(), settings_digest: str = ""):
    self.w, self.loop, self.steps = workload, loop, loop.steps
    self.out_dir = as_path(loop.out_dir)  # the run directory (`tlt_jax/paths.py`)
    prompts_per_step, group_size = loop.prompts_per_step, loop.group_size
    self.prompts_per_step, self.group_size, self.seed = prompts_per_step, group_size, loop.seed
    self.pool_prompts = prompt_pool if prompt_pool is not None else workload.prompts
    self.pool_answers = answers if answers is not None else workload.answers
    mesh, self.prompt_bucket = check_layout(loop, engine_cfg, self.pool_prompts, eval_prompts)
    self.updater = PolicyUpdater(workload.model, mesh, learner, optim, workload.params,
                                 loop.micro_batches, loop.remat, loop.max_tokens_per_micro_batch)
    if not engine_cfg.max_prompt_len:  # one cache layout for every step: nothing compiles later
      longest = max(len(p) for p in list(self.pool_prompts) + list(eval_prompts or []))
      engine_cfg = dataclasses.replace(engine_cfg, max_prompt_len=longest)
    try:
      self.engine = RolloutEngine(workload.model, engine_cfg, pad_id=workload.tokenizer.pad_id,
                                  spec=spec, drafter=as_proposer(drafter), costs=costs,
                                  replay=replay)
    except ValueError as e:
      raise ConfigError(f"config.rollout.engine: {e}") from None
    self.memory = PromptMemory(replay) if replay.noise == "prompt" else None
    self.adaptive = None
    if adaptive is not None:
      if drafter is None:
        raise ValueError("An adaptive drafter needs a drafter to start from (the warm-up one).")
      self.adaptive = AdaptiveDrafter(self.engine.drafter_port(), drafter, workload.model,
                                      adaptive, workload.tokenizer.pad_id)
    self.eval_prompts, self.eval_answers = eval_prompts, eval_answers
    self.ckpt_dir = self.out_dir / "checkpoints"
    self.settings_digest = settings_digest
    # Opened here where checkpoints exist (to resume), else once the run starts: a launch that
    # fails before its first step leaves no folder behind.
    self.ckpt = self._checkpoints() if self.ckpt_dir.is_dir() else None
    self.step = 0
    self._collective_s, self._collective_bytes = 0.0, 0  # this step's cross-process traffic
    self.warmup_report: dict = {}

  def _checkpoints(self) -> Checkpointer | None:
    return Checkpointer(self.ckpt_dir, keep=self.loop.keep) if self.loop.checkpoint_every else None

  def batch_indices(self, step: int, round_: int = 0) -> np.ndarray:
    """The data iterator, addressed by step (and top-up round): resuming at step s draws what a
    straight run would."""
    rng = np.random.default_rng([self.seed, step, round_] if round_ else [self.seed, step])
    return rng.choice(len(self.pool_prompts), self.prompts_per_step, replace=False)

  def generate(self, prompts, group_size: int, key, **kw) -> Spread:
    """The rollout of `prompts`, this process's share on its devices (`generate_spread`),
    its gather counted in the step's collective figures."""
    spread = generate_spread(self.engine, prompts, group_size, self.w.params, key, **kw)
    self._collective_s += spread.collective_s
    self._collective_bytes += spread.collective_bytes
    return spread

  def key(self, data: int) -> jax.Array:
    """The run's key for `data` (a step, or a fixed number for evaluation)."""
    return jax.random.fold_in(jax.random.key(self.seed), data)

  def warm_up(self, progress: bool = True) -> dict:
    """Builds (compiles, or loads from the caches) every program that a step, an evaluation and
    the drafter's hooks can run, so that no RL step builds one; returns the programs built and
    the seconds spent."""
    built, start = compiles.Since(), time.perf_counter()
    lengths = [len(p) for p in list(self.pool_prompts) + list(self.eval_prompts or [])]
    ad = self.adaptive
    procs = jax.process_count()  # each process generates its share of the prompts
    self.engine.warm_up([(self.prompts_per_step // procs, self.group_size)], self.w.params,
                        lengths, capture_hidden=ad is not None, progress=progress)
    warm_up_spread(self.prompts_per_step, self.group_size, self.w.params.max_new_tokens)
    if self.eval_prompts is not None and self.loop.eval_every:
      self.engine.warm_up([(len(self.eval_prompts) // procs, self.loop.eval_group_size)],
                          self.w.params, lengths, progress=progress)
      warm_up_spread(len(self.eval_prompts), self.loop.eval_group_size,
                     self.w.params.max_new_tokens)
    rows, loop = self.prompts_per_step * self.group_size, self.loop
    off_policy = loop.mini_batches * loop.update_epochs > 1
    self.updater.warm_up(rows // loop.mini_batches, self.prompt_bucket,
                         self.w.params.max_new_tokens, off_policy=off_policy,
                         shortest_prompt=min(map(len, self.pool_prompts)))  # what updates see
    self.updater.learner.advantages(jnp.asarray(np.zeros(rows, np.float32)),
                                    self.group_size)  # as a step converts its rewards
    self.sync_policy()  # the weight sync's programs (its resharding, its casts)
    self.key(0)
    if ad is not None:
      ad.warm_up(self.w.params.max_new_tokens)
    return {"warmup_s": round(time.perf_counter() - start, 3), "warmup_programs": built.events}

  def train_step(self) -> tuple[dict, dict]:
    """One RL step, as named stages: sample (the rollout; the drafter's hooks around it), score,
    select (the learner's groups, with top-up rounds when it asks for them), advantages, update,
    sync, drafter, record. Returns (metrics, rollout record); `run` adds the programs built
    during the step and its hooks (`compile_events`, `time/compile_s`)."""
    t0 = time.perf_counter()
    self._collective_s, self._collective_bytes = 0.0, 0
    first, res, drafter_metrics = self.sample()
    chosen, select_metrics = self.select(first)
    t_rollout = time.perf_counter() - t0
    n, learner = self.w.params.max_new_tokens, self.updater.learner
    toks, plen, mask = chosen.pack(self.prompt_bucket, n, self.w.tokenizer.pad_id)
    shaped = learner.shape_rewards(chosen.rewards_R, chosen.lengths_R, n)
    adv = learner.advantages(jnp.asarray(shaped), self.group_size)
    batch = PolicyBatch(toks, plen, mask, np.asarray(adv), None,
                        self.updater.ref_logprobs(toks, plen, mask))
    t1 = time.perf_counter()
    metrics, mismatch = rollout_update(
        self.updater, batch, chosen.logprobs_RxN, self.loop.mini_batches, self.loop.update_epochs,
        np.random.default_rng([self.seed, self.step, _UPDATE_ORDER]))
    t_sync = time.perf_counter()
    self.sync_policy()
    t_sync = time.perf_counter() - t_sync
    if self.adaptive is not None:
      self.adaptive.after_update()
    t_update = time.perf_counter() - t1
    weights = self.engine.weights
    out = step_metrics(
        self.step, first, res, metrics | select_metrics, mismatch, drafter_metrics,
        seconds={"rollout": t_rollout, "update": t_update, "weight_sync": t_sync,
                 "collective": self._collective_s, "step": time.perf_counter() - t0},
        counts={"drafter_version": weights.drafter_version, "sync_bytes": weights.sync_bytes,
                "collective_bytes": self._collective_bytes})
    record = rollout_record(self.step, res)
    if self.memory is not None:
      self.memory.end_step()
    self.step += 1
    return out, record

  def _rollout(self, round_: int, **kw) -> tuple[Samples, Spread]:
    """Round `round_` of this step's rollout (0: the step's own; later ones: top-ups), scored
    by the task's reward."""
    idx = self.batch_indices(self.step, round_)
    key = self.key(self.step)
    if round_:
      key = jax.random.fold_in(key, round_)
    prompts, g = [self.pool_prompts[i] for i in idx], self.group_size
    if self.memory is not None:  # the address carries the step's randomness
      key, request = self.key(_PROMPT_NOISE), self.memory.request(prompts, g)
      kw.update(request)
    spread = self.generate(prompts, g, key, capture_hidden=self.adaptive is not None, **kw)
    res = spread.whole
    answers = [self.pool_answers[i] for i in idx]
    rewards = self.w.rewards(res, answers, g)
    responses = [res.response(i) for i in range(len(rewards))]
    if self.memory is not None:
      self.memory.record(request["addresses"], responses)
    return Samples(prompts, answers, g, responses, np.asarray(res.logprobs), np.asarray(
        res.lengths), rewards, np.ones(len(rewards), bool)), spread

  def sample(self) -> tuple[Samples, object, dict]:
    """The step's rollout, with the adaptive drafter's spot training in its idle windows and
    its publishing after it: (samples, the rollout's result, the drafter's metrics)."""
    ad = self.adaptive
    first, spread = self._rollout(0, on_shard_idle=ad.on_shard_idle if ad is not None else None)
    metrics = {}
    if ad is not None:  # it trains on this process's rows (their hidden states stay here)
      metrics = ad.after_rollout(spread.prompts, self.group_size, spread.local, self.step,
                                 self.updater.step_count)
    return first, spread.whole, metrics

  def select(self, first: Samples) -> tuple[Samples, dict]:
    """The groups the update learns from, as the learner chooses them: kept groups of the first
    round, then of top-up rounds (at most `learner.max_rounds`) until `prompts_per_step` are
    kept; the shape never changes (missing groups are masked-out fillers)."""
    learner = self.updater.learner
    rounds, keep = [first], [learner.keep_groups(first.rewards_PxG())]
    while sum(int(k.sum()) for k in keep) < self.prompts_per_step and len(rounds) <= \
        learner.max_rounds:
      more, _ = self._rollout(len(rounds))
      rounds.append(more)
      keep.append(learner.keep_groups(more.rewards_PxG()))
    chosen, kept = select_groups(rounds, keep, self.prompts_per_step)
    if learner.max_rounds == 0 and kept == self.prompts_per_step:
      return chosen, {}
    return chosen, {"kept_groups": kept, "kept_fraction": kept / self.prompts_per_step,
                    "top_up_rounds": len(rounds) - 1,
                    "pool_dry": float(kept < self.prompts_per_step)}

  def sync_policy(self) -> None:
    """The updated policy onto this process's rollout shards, resharded from the update's layout
    (`rollout/weights.py`); the adaptive drafter reads its embedding and head from there."""
    self.engine.weights.set_policy(nnx.state(self.updater.model()))

  def run(self, progress: bool = True, on_start=None) -> list[dict]:
    """Warms up, then trains to `steps` (resuming if the run directory has a checkpoint);
    returns this call's step records. Each record's `compile_events` counts every XLA program
    built during its step and evaluations (0 after a complete warm-up). `on_start(resumed,
    step)`: called on process 0 once the run has started (restored and warmed up), before its
    first record; nothing is written into the run directory before."""
    progress = progress and distributed.is_writer()
    resumed = resume.restore(self)
    if self.step < self.steps:
      self.warmup_report = self.warm_up(progress)
    if self.ckpt is None:
      self.ckpt = self._checkpoints()
    if distributed.is_writer():
      self.out_dir.mkdir(parents=True, exist_ok=True)
      if self.warmup_report:
        (self.out_dir / "warmup.json").write_text(json.dumps(self.warmup_report))
      if on_start is not None:
        on_start(resumed, self.step)
    writer = RunWriter(self.out_dir, resumed, enabled=distributed.is_writer(),
                       loggers=self.loop.loggers)
    hooks = loop_hooks(self, writer)
    history = []
    bar = tqdm(range(self.step, self.steps), desc=self.updater.learner.name,
               disable=not progress, initial=self.step, total=self.steps)
    try:
      for _ in bar:
        built = compiles.Since()
        before = {k: v for h in hooks for k, v in h.before_step(self).items()}
        m, record = _checked_step(self)
        m.update(before)
        for h in hooks:
          m.update(h.after_step(self))
        m["compile_events"], m["time/compile_s"] = built.events, round(built.seconds, 3)
        history.append(m)
        writer.step(m, record)
        bar.set_postfix(reward=f"{m['reward']:.3f}", len=f"{m['rollout/length_p50']:.0f}",
                        acc_len=f"{m['spec/accept_len']:.2f}")
        for h in hooks:
          h.after_record(self)
      for h in hooks:
        h.at_end(self, history)
    finally:
      for h in hooks:
        h.close(self)
      writer.close()
    return history


def _checked_step(trainer: Trainer) -> tuple[dict, dict]:
  """`trainer.train_step()`, with a non-finite loss turned into a `TrainingError` that says what
  the checkpoints still hold."""
  try:
    return trainer.train_step()
  except FloatingPointError as e:
    last = trainer.ckpt.latest_step() if trainer.ckpt is not None else None
    where = (f"the last good checkpoint is step {last} in {trainer.ckpt_dir}" if last
             is not None else "no checkpoint was written yet")
    raise TrainingError(f"Stopped at step {trainer.step}: {e} Nothing was saved after the "
                        f"fault; {where}.") from e
