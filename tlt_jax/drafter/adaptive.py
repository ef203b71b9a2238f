"""The adaptive drafter in the RL loop: capture -> buffer -> spot training -> checked publishing.

Per RL step the trainer calls, in order:
  1. `on_shard_idle` (passed to `RolloutEngine.generate`): a shard finished all its rows while
     others still decode; spot training starts on that device (every idle device its own replica);
  2. `after_rollout`: the windows are preempted and merged; with `budget_s` > 0 the drafter
     also trains that long between the rollout and the update (the one-device mode); the
     candidate is checked on the new rollout's segments (held back: not trained on yet) and
     published; then those segments enter the buffer;
  3. `after_update`: the new policy's embedding and head are what the drafter reads from now on.

The drafter reads the policy's embedding and head where the rollout shards hold them
(`DrafterPort.token_params`): each idle window on its own shard's device, in the compute dtype
the engine drafts with; nothing of the policy is gathered for it.

With several processes each trains its own replica on its own rows' segments in its own idle
windows; after the rollout one collective averages the replicas (the same bits everywhere),
process 0's check decides whether that average is published, and every process installs it: all
shards on all hosts verify with the same drafter version and weights at every RL step. Under the
`coupled` rule the drafter cannot change what is sampled; under `rejection` it changes which
tokens are drawn (never their distribution), so a run's tokens then depend on the process count.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time

import jax
import numpy as np
from flax import nnx

from tlt_jax import distributed
from tlt_jax.drafter.buffer import BufferConfig, DataBuffer
from tlt_jax.drafter.publish import DrafterPublisher, PublishConfig
from tlt_jax.drafter.spot import SpotConfig, SpotTrainer
from tlt_jax.drafter.train import DrafterTrainConfig, DrafterTrainer
from tlt_jax.drafter.serving import export_drafter, serving_folder
from tlt_jax.drafter.warmup import save_drafter
from tlt_jax.hashing import content_digest
from tlt_jax.rollout.port import DrafterPort
from tlt_jax.typed import typed


@dataclasses.dataclass(frozen=True)
class AdaptiveConfig:
  """The adaptive drafter's settings (`config.drafter.adaptive`): its optimizer, the buffer of
  captured segments, spot training, checked publishing, and how many of each new rollout's
  segments check a candidate."""

  # Spot training comes in short bursts on recent data: a higher rate and a short warm-up than
  # the offline warm-up's defaults.
  train: DrafterTrainConfig = DrafterTrainConfig(lr=1e-3, warmup_steps=5)
  buffer: BufferConfig = BufferConfig()
  spot: SpotConfig = SpotConfig()
  publish: PublishConfig = PublishConfig()
  holdout_rows: int = 16         # segments of each new rollout used to check a candidate

  @classmethod
  def from_dict(cls, d, key: str = "drafter.adaptive") -> "AdaptiveConfig":
    """From a config section (`key`: where it sits, for the error messages)."""
    # A nested section's keys over this config's own default of that part.
    part = lambda name, section: typed(
        type(getattr(cls, name)), {**dataclasses.asdict(getattr(cls, name)), **(section or {})},
        f"{key}.{name}")
    return typed(cls, d, key, **{name: functools.partial(part, name)
                                 for name in ("train", "buffer", "spot", "publish")})


class AdaptiveDrafter:
  """The drafter that follows the changing policy, driven by the RL loop's hooks (this module's
  docstring lists them): captured segments go into its buffer, idle rollout devices train it, and
  a candidate that checks out on held-back segments is published to every shard."""

  def __init__(self, port: DrafterPort, drafter, target, cfg: AdaptiveConfig, pad_id: int):
    if drafter.cfg.feature_layers:
      raise ValueError("The adaptive drafter trains from captured final hidden states; an "
                       "EAGLE-3 drafter fusing several layers (feature_layers) is not supported "
                       "here. Use feature_layers=() or keep that drafter frozen.")
    self.port, self.cfg, self.pad_id = port, cfg, pad_id
    self.buffer = DataBuffer(cfg.buffer, port.hidden_width, port.hidden_dtype, port.devices[0],
                             seed=cfg.spot.seed)
    self.spot = SpotTrainer(DrafterTrainer(drafter, target, cfg.train), self.buffer, cfg.spot,
                            pad_id)
    self.publisher = DrafterPublisher(port, cfg.publish)
    self.in_use = self.spot.trainer.params      # the published version's parameters
    self._log_mark = 0

  def warm_up(self, max_new_tokens: int) -> None:
    """Builds what the hooks run (the buffer's writes of a rollout's rows of up to
    `max_new_tokens` tokens, a spot-training step on every rollout device, the publishing
    check) before the first RL step, on empty data: nothing is trained or published. The
    drafter reads the engine's embedding and head from here on."""
    self.after_update()
    self.buffer.warm_up(list(self.port.harvest_buckets), max_new_tokens, self.port.hidden_dtype)
    for device in self.port.devices:
      self.spot.warm_up(device)
      self.publisher.finite(jax.device_put(self.in_use, device))
      self.port.warm_up_publish(jax.device_put(self.in_use, device))
    self.publisher.warm_up(self.in_use, self.spot.trainer.target_params, self._holdout_batch([]))
    if jax.process_count() > 1:  # the collectives `after_rollout` runs
      distributed.mean_replicas(self.spot.trainer.state())
      distributed.warm_up()

  # ---------------------------------------------------------------- the loop's hooks

  def on_shard_idle(self, shard: int, device) -> None:
    """The engine's call when shard `shard` has no live row: spot training starts on `device`
    with the shard's own embedding and head (with one rollout device there is no idle window;
    `spot.budget_s` trains after the rollout)."""
    if len(self.port.devices) > 1:
      self.spot.start(device, self.port.token_params(shard))

  def after_rollout(self, prompts, group_size: int, result, step: int,
                    policy_version: int) -> dict:
    """Stops spot training, checks and maybe publishes the candidate on held-back segments of
    this rollout, then adds the rollout's segments to the buffer; returns the step's drafter
    metrics."""
    t0 = time.perf_counter()
    self.spot.preempt()
    preempt_s = time.perf_counter() - t0
    budget_steps = (self.spot.train_steps(self.cfg.spot.budget_steps)
                    + self.spot.train_for(self.cfg.spot.budget(result.timeline.wall_s)))
    if jax.process_count() > 1:
      self.spot.trainer.load_state(distributed.mean_replicas(self.spot.trainer.state()))
    # The new rows enter the buffer after the candidate's last step: they are held back.
    rows = self.buffer.add_rollout(prompts, group_size, result, policy_version, step)
    rng = np.random.default_rng([self.cfg.spot.seed, step])
    sample = [rows[i] for i in rng.choice(len(rows), min(self.cfg.holdout_rows, len(rows)),
                                          replace=False)] if rows else []
    steps = self.spot.log[self._log_mark:]
    published = False
    if distributed.total(float(bool(steps and sample))) > 0:  # all processes, or none, check
      # The policy this rollout ran: what `after_update` gave the trainer at the last sync.
      published = self.publisher.publish(self.spot.trainer.params, self.spot.trainer.target_params,
                                          self._holdout_batch(sample) if sample else None,
                                          current=self.in_use, agree=distributed.first)
      if published:
        self.in_use = self.spot.trainer.params
    idle_available = float(sum(result.timeline.wall_s - end for end in
                               result.timeline.shard_end))
    idle_used = float(sum(r.end - r.start for r in steps if r.start < t0))
    self._log_mark = len(self.spot.log)
    out = {
        "drafter/steps": len(steps), "drafter/budget_steps": budget_steps,
        "drafter/published": bool(published), "drafter/buffer_tokens": self.buffer.tokens,
        "time/drafter_s": round(time.perf_counter() - t0, 4),
        "time/drafter_preempt_s": round(preempt_s, 4),
        "drafter/idle_used_s": round(min(idle_used, idle_available), 4),
    }
    if jax.process_count() > 1:  # every process verifies with the same version and weights
      out["drafter/replicas_agree"] = distributed.same(content_digest(
          [self.port.drafter_version]
          + [np.asarray(x).tobytes().hex() for x in jax.tree.leaves(self.in_use)]))
    if steps:  # figures of this step's training and candidate (absent when it did not train)
      out["drafter/loss"] = float(np.mean([r.loss for r in steps]))
      out["drafter/top1"] = float(np.mean([r.top1 for r in steps]))
      if sample:
        last = self.publisher.events[-1]
        out["drafter/holdout_accept_len"] = last.get("accept_len", 0.0)
        out["drafter/in_use_accept_len"] = last.get("in_use_accept_len", 0.0)
    return out

  def _holdout_batch(self, sample):
    return self.buffer.pack(sample, self.cfg.publish.seq_len, self.pad_id,
                            rows=self.cfg.holdout_rows)

  def stop(self) -> None:
    """Stops spot training where it runs (the run is ending)."""
    self.spot.preempt()

  def after_update(self) -> None:
    """From now on the drafter reads the new policy's embedding and head (the engine's, after
    the weight sync)."""
    self.spot.trainer.set_target(self.port.token_params(0))

  # ---------------------------------------------------------------- state and export

  def state(self) -> dict:
    """What a checkpoint keeps of what every process holds alike: the trainer's parameters and
    optimizer state, and the published ones."""
    return {**self.spot.trainer.state(), "in_use": self.in_use}

  def local_state(self) -> dict:
    """What this process alone holds and a checkpoint keeps per process: its data buffer
    (`DataBuffer.state`; processes capture their own rows)."""
    return self.buffer.state()

  def load_local_state(self, state: dict) -> None:
    """Restores this process's data buffer."""
    self.buffer.load_state(state)

  def load_state(self, state: dict, version: int) -> None:
    """Restores `state` and publishes its in-use parameters as drafter version `version`."""
    self.spot.trainer.load_state(state)
    self.in_use = state["in_use"]
    self.port.publish(self.in_use, version)

  def drafter(self):
    """The published drafter (what the engine uses)."""
    return nnx.merge(self.spot.trainer.graphdef, self.in_use)

  def export(self, directory: str, target, meta: dict | None = None) -> str:
    """Saves the published drafter under `directory/drafter` (what `generate --drafter` loads)
    and in the serving layout that holds it (EAGLE-1, or speculators' EAGLE-3 for an "eagle3"
    drafter of `target`, exported beside it as `directory/policy`) under
    `directory/<serving_folder>` (its README says how to serve it, and what the served drafter
    does otherwise); returns that folder's name."""
    drafter = self.drafter()
    save_drafter(drafter, os.path.join(directory, "drafter"),
                 {"version": self.publisher.version, **(meta or {})})
    export_drafter(drafter, os.path.join(directory, serving_folder(drafter)), target=target,
                   verifier=os.path.abspath(os.path.join(directory, "policy")))
    return serving_folder(drafter)
