"""The GRPO loop: prompts -> rollout (engine, optionally speculative) -> rewards -> update ->
weight sync, with JSONL + TensorBoard metrics and orbax checkpoints.

`baseline` and `tlt` runs are the same loop; `tlt` only adds speculative decoding to the rollout
engine. With the `coupled` rule the rollouts, and so the whole run, are identical.
"""

from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from tlt_jax.checkpoint import Checkpointer
from tlt_jax.models.sharding import make_mesh
from tlt_jax.rl.grpo import GRPOConfig, group_advantages
from tlt_jax.rl.update import OptimConfig, PolicyBatch, PolicyUpdater
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.spec.strategy import SpecConfig


def pack_rows(prompts, responses, prompt_bucket: int, n: int, pad_id: int):
  """Sequences `[R, P + N]` (prompt left-aligned, response right after it), prompt lengths,
  response masks `[R, N]`."""
  r = len(responses)
  toks = np.full((r, prompt_bucket + n), pad_id, np.int32)
  mask = np.zeros((r, n), np.float32)
  plen = np.zeros(r, np.int32)
  for i, (p, resp) in enumerate(zip(prompts, responses)):
    toks[i, : len(p)] = p
    toks[i, len(p): len(p) + len(resp)] = resp
    mask[i, : len(resp)] = 1.0
    plen[i] = len(p)
  return toks, plen, mask


class Trainer:
  def __init__(self, workload, *, out_dir: str, steps: int, prompts_per_step: int,
               group_size: int, engine_cfg: EngineConfig, grpo: GRPOConfig, optim: OptimConfig,
               seed: int = 0, spec: SpecConfig | None = None, drafter=None,
               prompt_pool: list | None = None, answers: list | None = None,
               checkpoint_every: int = 0, keep: int = 2, micro_batches: int = 1):
    self.w, self.out_dir, self.steps = workload, out_dir, steps
    self.prompts_per_step, self.group_size, self.seed = prompts_per_step, group_size, seed
    self.pool_prompts = prompt_pool if prompt_pool is not None else workload.prompts
    self.pool_answers = answers if answers is not None else workload.answers
    self.prompt_bucket = next(b for b in engine_cfg.prefill_buckets
                              if b >= max(len(p) for p in self.pool_prompts))
    self.updater = PolicyUpdater(workload.model, make_mesh(1, 1), grpo, optim, workload.params,
                                 micro_batches)
    self.engine = RolloutEngine(workload.model, engine_cfg, pad_id=workload.tokenizer.pad_id,
                                spec=spec, drafter=drafter)
    self.ckpt = Checkpointer(os.path.join(out_dir, "checkpoints"), keep=keep) \
        if checkpoint_every else None
    self.checkpoint_every = checkpoint_every
    self.step = 0
    os.makedirs(out_dir, exist_ok=True)

  def _batch_indices(self, step: int) -> np.ndarray:
    """The data iterator, addressed by step: resuming at step s draws what a straight run would."""
    rng = np.random.default_rng([self.seed, step])
    return rng.choice(len(self.pool_prompts), self.prompts_per_step, replace=False)

  def train_step(self) -> dict:
    t0 = time.perf_counter()
    idx = self._batch_indices(self.step)
    prompts = [self.pool_prompts[i] for i in idx]
    key = jax.random.fold_in(jax.random.key(self.seed), self.step)
    res = self.engine.generate(prompts, self.group_size, self.w.params, key)
    t_rollout = time.perf_counter() - t0
    g = self.group_size
    rewards = np.array([self.w.reward_fn(res.response(i), self.pool_answers[idx[i // g]])
                        for i in range(len(res.lengths))], np.float32)
    n = self.w.params.max_new_tokens
    toks, plen, mask = pack_rows([prompts[i // g] for i in range(len(rewards))],
                                 [res.response(i) for i in range(len(rewards))],
                                 self.prompt_bucket, n, self.w.tokenizer.pad_id)
    old_logp, _ = self.updater.logprobs(jnp.asarray(toks), jnp.asarray(plen), n)
    mismatch = float(np.max(np.abs(np.asarray(old_logp) - res.logprobs) * mask))
    adv = group_advantages(jnp.asarray(rewards), g, self.updater.grpo.normalize_std)
    batch = PolicyBatch(jnp.asarray(toks), jnp.asarray(plen), jnp.asarray(mask), adv, old_logp,
                        jnp.zeros_like(old_logp))
    t1 = time.perf_counter()
    metrics = self.updater.update(batch)
    self.engine.set_weights(self._engine_state())
    t_update = time.perf_counter() - t1
    r = rewards.reshape(-1, g)
    summary = res.timeline.summary()
    out = {
        "step": self.step, "reward": float(rewards.mean()),
        "mixed_group_fraction": float((r.max(1) > r.min(1)).mean()),
        "length_p50": float(np.percentile(res.lengths, 50)),
        "length_p90": float(np.percentile(res.lengths, 90)), "length_max": int(res.lengths.max()),
        "rollout_s": round(t_rollout, 4), "update_s": round(t_update, 4),
        "step_s": round(time.perf_counter() - t0, 4),
        "tokens_per_s": summary["tokens_per_s"], "sd_on_fraction": summary["sd_on_fraction"],
        "accept_len": summary.get("spec", {}).get("accept_len", 0.0),
        "drafter_version": self.engine.drafter_version,
        "compile_events": summary["compile_events"], "logprob_mismatch_max": mismatch,
        **{f"grpo/{k}": v for k, v in metrics.items()},
    }
    out["rollout_share"] = round(out["rollout_s"] / out["step_s"], 4)
    self.step += 1
    return out

  def _engine_state(self):
    from flax import nnx
    return nnx.state(self.updater.model())

  def save(self) -> None:
    self.ckpt.save(self.step, {"params": self.updater.params, "opt": self.updater.opt_state},
                   {"step": self.step, "seed": self.seed})

  def restore(self) -> bool:
    """Resumes from the latest checkpoint if the run directory has one."""
    if self.ckpt is None or self.ckpt.latest_step() is None:
      return False
    state, meta, _ = self.ckpt.restore({"params": self.updater.params,
                                        "opt": self.updater.opt_state})
    self.updater.params, self.updater.opt_state = state["params"], state["opt"]
    self.step = int(meta["step"])
    self.engine.set_weights(self._engine_state())
    return True

  def run(self, progress: bool = True) -> list[dict]:
    from tensorboardX import SummaryWriter
    resumed = self.restore()
    writer = SummaryWriter(os.path.join(self.out_dir, "tb"))
    log = open(os.path.join(self.out_dir, "metrics.jsonl"), "a" if resumed else "w")
    history = []
    bar = tqdm(range(self.step, self.steps), desc="grpo", disable=not progress,
               initial=self.step, total=self.steps)
    for _ in bar:
      m = self.train_step()
      history.append(m)
      log.write(json.dumps(m) + "\n")
      log.flush()
      for k, v in m.items():
        if isinstance(v, (int, float)):
          writer.add_scalar(k, v, m["step"])
      bar.set_postfix(reward=f"{m['reward']:.3f}", len=f"{m['length_p50']:.0f}")
      if self.ckpt is not None and self.step % self.checkpoint_every == 0:
        self.save()
    if self.ckpt is not None:
      self.ckpt.wait()
    writer.close()
    log.close()
    return history
