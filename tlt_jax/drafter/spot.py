"""Spot training of the drafter: steps run on a device whose rollout shard has no live row left
while other shards still decode, are preempted between steps when the devices are needed for the
policy update, and resume at the next idle window with their state intact.

With one device there is no idle window inside a rollout; the trainer then gives the drafter a
configured budget of seconds between the rollout and the policy update (`train_for`).

Batches are addressed by the drafter's step count (`seed`, step): a run preempted and resumed
takes the same steps on the same data as one that was never interrupted.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from tlt_jax.drafter.buffer import DataBuffer, pack_segments
from tlt_jax.drafter.train import DrafterTrainer


@dataclasses.dataclass(frozen=True)
class SpotConfig:
  batch_rows: int = 16
  seq_len: int = 128            # positions per training row (longer segments: a random window)
  budget_s: float = 0.0         # between phases (one device): seconds of training per RL step
  max_steps_per_window: int = 0  # 0: until preempted
  min_segments: int = 8         # train only once the buffer holds this many segments
  seed: int = 0

  def __post_init__(self):
    if self.batch_rows < 1 or self.seq_len < 2 or self.budget_s < 0:
      raise ValueError(f"SpotConfig needs batch_rows >= 1, seq_len >= 2, budget_s >= 0; got "
                       f"{self}.")


@dataclasses.dataclass
class StepRecord:
  device: int          # device id the step ran on
  start: float         # time.perf_counter() at the step's start and end
  end: float
  loss: float
  top1: float


class SpotTrainer:
  """Owns the drafter's `DrafterTrainer` and trains it from a `DataBuffer` on idle devices."""

  def __init__(self, trainer: DrafterTrainer, buffer: DataBuffer, cfg: SpotConfig, pad_id: int):
    self.trainer, self.buffer, self.cfg, self.pad_id = trainer, buffer, cfg, pad_id
    self.log: list[StepRecord] = []
    self._thread: threading.Thread | None = None
    self._stop = threading.Event()
    self._error: BaseException | None = None
    self._lock = threading.Lock()

  @property
  def ready(self) -> bool:
    return len(self.buffer) >= self.cfg.min_segments

  def _batch(self):
    rng = np.random.default_rng([self.cfg.seed, self.trainer.step_count])
    segs = self.buffer.sample(self.cfg.batch_rows, rng)
    return pack_segments(segs, self.cfg.seq_len, self.pad_id)

  def _one_step(self, device) -> None:
    toks, hidden, mask = self._batch()
    put = lambda x: jax.device_put(x, device)
    start = time.perf_counter()
    self.trainer.place(device)
    hidden_d = put(jnp.asarray(hidden, self.trainer.feature_dtype))
    m = self.trainer.step(put(toks), hidden_d, hidden_d, put(mask))
    self.log.append(StepRecord(device.id, start, time.perf_counter(), m["loss"],
                               m["top1_agreement"]))

  def warm_up(self, device, d_model: int) -> None:
    """Builds the programs of a spot-training step on `device` by running one on zeros and
    discarding its result (the drafter, its optimizer state and step count are unchanged)."""
    t, put = self.trainer, lambda x: jax.device_put(x, device)
    toks = np.full((self.cfg.batch_rows, self.cfg.seq_len), self.pad_id, np.int32)
    hidden = put(jnp.asarray(np.zeros(toks.shape + (d_model,), np.float32), t.feature_dtype))
    out = t.update_fn(put(t.params), put(t.opt_state), put(t.target_params), put(toks), hidden,
                      hidden, put(np.zeros(toks.shape, np.float32)))
    jax.block_until_ready(out)

  def train_steps(self, n: int, device=None) -> int:
    """`n` steps now, on `device` (default: the first device)."""
    device = device or jax.local_devices()[0]
    for _ in range(n):
      self._one_step(device)
    return n

  def train_for(self, seconds: float, device=None) -> int:
    """Steps until `seconds` have passed (one-device mode: the budget between phases)."""
    if seconds <= 0 or not self.ready:
      return 0
    device = device or jax.local_devices()[0]
    deadline, done = time.perf_counter() + seconds, 0
    while time.perf_counter() < deadline:
      self._one_step(device)
      done += 1
    return done

  def start(self, device) -> bool:
    """Begins training on `device` in the background (an idle window opened); False when a
    window is already running or the buffer is not ready."""
    with self._lock:
      if self._thread is not None or not self.ready:
        return False
      self._stop.clear()
      self._thread = threading.Thread(target=self._window, args=(device,), daemon=True)
      self._thread.start()
      return True

  def _window(self, device) -> None:
    done = 0
    try:
      while not self._stop.is_set():
        if self.cfg.max_steps_per_window and done >= self.cfg.max_steps_per_window:
          break
        self._one_step(device)
        done += 1
    except BaseException as e:  # surfaced by preempt() in the caller's thread
      self._error = e

  def preempt(self) -> None:
    """Stops the background window after its current step; state (weights, optimizer state,
    step count) is kept for the next window."""
    with self._lock:
      thread, self._thread = self._thread, None
    if thread is not None:
      self._stop.set()
      thread.join()
    if self._error is not None:
      err, self._error = self._error, None
      raise RuntimeError(f"Drafter spot training failed: {err}") from err

  @property
  def running(self) -> bool:
    return self._thread is not None

  def busy_seconds(self, since: int = 0) -> float:
    return float(sum(r.end - r.start for r in self.log[since:]))
