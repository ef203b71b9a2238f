"""Spot training of the drafter: steps run on a device whose rollout shard has no live row left
while other shards still decode, are preempted between steps when the devices are needed for the
policy update, and resume at the next idle window with their state intact.

Every idle device trains at once: each window trains its own replica of the drafter (its state
at the rollout's start), and `preempt` merges the replicas, the mean of their weights and
optimizer moments (one window: its state as it is). With one device there is no idle window
inside a rollout; the trainer then gives the drafter a configured budget of seconds between the
rollout and the policy update: `budget_steps` steps (`train_steps`), or `budget_s` seconds plus
`budget_share` of the rollout's (`train_for`).

Batches are addressed by the drafter's step count and the window's index among those open at
once (`seed`, step[, index]): a run preempted and resumed takes the same steps on the same data as
one that was never interrupted.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import jax
import numpy as np

from tlt_jax import distributed
from tlt_jax.drafter.buffer import DataBuffer
from tlt_jax.drafter.train import DrafterTrainer


@dataclasses.dataclass(frozen=True)
class SpotConfig:
  """Spot training's settings: batch shape, the one-device budget per RL step, a cap per idle
  window, the segments the buffer must hold first, and the sampling seed."""

  batch_rows: int = 16          # segments per training step
  seq_len: int = 128            # positions per training row (longer segments: a random window)
  budget_s: float = 0.0         # between phases (one device): seconds of training per RL step
  budget_share: float = 0.0     # ... plus this share of the step's rollout seconds
  budget_steps: int = 0         # ... or this many steps (the same whatever the machine's speed)
  max_steps_per_window: int = 0  # 0: until preempted
  min_segments: int = 16        # train only once the buffer holds this many segments
  seed: int = 0                 # the batches' draws (addressed by step and window)

  def __post_init__(self):
    if (self.batch_rows < 1 or self.seq_len < 2 or self.budget_s < 0 or self.budget_steps < 0
        or not 0 <= self.budget_share <= 1):
      raise ValueError(f"SpotConfig needs batch_rows >= 1, seq_len >= 2, budget_s >= 0, "
                       f"budget_steps >= 0, 0 <= budget_share <= 1; got {self}.")

  def budget(self, rollout_s: float) -> float:
    """Seconds of one-device training after a rollout of `rollout_s` seconds."""
    return self.budget_s + self.budget_share * rollout_s


@dataclasses.dataclass
class StepRecord:
  """One spot-training step: where and when it ran, its loss and top-1 agreement."""

  device: int          # device id the step ran on
  start: float         # time.perf_counter() at the step's start and end
  end: float
  loss: float
  top1: float


@dataclasses.dataclass
class _Window:
  """One idle window: its thread and the replica it trains on its device (from `base`, the
  drafter's step count when the window opened)."""

  device: object
  index: int
  base: int
  params: object
  opt_state: object
  target_params: object
  steps: int = 0
  thread: threading.Thread | None = None


class SpotTrainer:
  """Owns the drafter's `DrafterTrainer` and trains it from a `DataBuffer` on idle devices."""

  def __init__(self, trainer: DrafterTrainer, buffer: DataBuffer, cfg: SpotConfig, pad_id: int):
    self.trainer, self.buffer, self.cfg, self.pad_id = trainer, buffer, cfg, pad_id
    self.log: list[StepRecord] = []
    self._windows: list[_Window] = []  # open since the last `preempt`, in opening order
    self._stop = threading.Event()
    self._error: BaseException | None = None
    self._lock = threading.Lock()

  @property
  def ready(self) -> bool:
    """Whether the buffer holds enough segments to train on."""
    return len(self.buffer) >= self.cfg.min_segments

  def batch(self, step: int, index: int = 0):
    """The batch of drafter step `step` in the `index`-th window open at once (0: the one
    `train_steps` and `train_for` take too): tokens and mask on the host, hidden states in the
    drafter's feature dtype on the buffer's device."""
    rng = np.random.default_rng([self.cfg.seed, step] + ([index] if index else []))
    segs = self.buffer.sample(self.cfg.batch_rows, rng)
    return self.buffer.pack(segs, self.cfg.seq_len, self.pad_id,
                            dtype=self.trainer.feature_dtype)

  def _one_step(self, device) -> None:
    t = self.trainer
    t.place(device)
    w = _Window(device, 0, t.step_count, t.params, t.opt_state, t.target_params)
    self._window_step(w)
    t.params, t.opt_state, t.step_count = w.params, w.opt_state, t.step_count + 1

  def _window_step(self, w: _Window) -> None:
    toks, hidden, mask = self.batch(w.base + w.steps, w.index)
    put = lambda x: jax.device_put(x, w.device)
    start = time.perf_counter()
    hidden_d = put(hidden)
    w.params, w.opt_state, m = self.trainer.update_fn(
        w.params, w.opt_state, w.target_params, put(toks), hidden_d, hidden_d, put(mask))
    w.steps += 1
    self.log.append(StepRecord(w.device.id, start, time.perf_counter(), float(m["loss"]),
                               float(m["top1_agreement"])))

  def warm_up(self, device) -> None:
    """Builds the programs of a spot-training step on `device` by running one on an empty
    batch and discarding its result (the drafter, its optimizer state and step count are
    unchanged)."""
    t, put = self.trainer, lambda x: jax.device_put(x, device)
    toks, hidden, mask = self.buffer.pack([], self.cfg.seq_len, self.pad_id,
                                          rows=self.cfg.batch_rows, dtype=t.feature_dtype)
    hidden = put(hidden)
    out = t.update_fn(put(t.params), put(t.opt_state), put(t.target_params), put(toks), hidden,
                      hidden, put(mask))
    jax.block_until_ready(out)

  def train_steps(self, n: int, device=None) -> int:
    """`n` steps now, on `device` (default: the first device); none before the buffer is
    ready."""
    if n <= 0 or not self.ready:
      return 0
    device = device or jax.local_devices()[0]
    for _ in range(n):
      self._one_step(device)
    return n

  def train_for(self, seconds: float, device=None) -> int:
    """Steps while the next, as long as the last one took, ends within `seconds` (one-device
    mode: the budget between phases); the first step of a run is taken to learn its length."""
    if seconds <= 0 or not self.ready:
      return 0
    device = device or jax.local_devices()[0]
    deadline, done = time.perf_counter() + seconds, 0
    while True:
      if self.log and time.perf_counter() + self.log[-1].end - self.log[-1].start > deadline:
        return done
      self._one_step(device)
      done += 1

  def start(self, device, target_params=None) -> bool:
    """Begins training a replica on `device` in the background (its idle window opened) against
    `target_params` (the target's embedding and head on `device`; default: the trainer's, copied
    there); False when a window already runs there or the buffer is not ready."""
    with self._lock:
      if any(w.device == device for w in self._windows) or not self.ready:
        return False
      t, put = self.trainer, lambda x: jax.device_put(x, device)
      target = put(t.target_params if target_params is None else target_params)
      w = _Window(device, len(self._windows), t.step_count, put(t.params), put(t.opt_state),
                  target)
      if not self._windows:
        self._stop.clear()
      w.thread = threading.Thread(target=self._window, args=(w,), daemon=True)
      self._windows.append(w)
      w.thread.start()
      return True

  def _window(self, w: _Window) -> None:
    try:
      while not self._stop.is_set():
        if self.cfg.max_steps_per_window and w.steps >= self.cfg.max_steps_per_window:
          break
        self._window_step(w)
    except BaseException as e:  # surfaced by preempt() in the caller's thread
      self._error = e

  def preempt(self) -> None:
    """Stops every window after its current step and merges what they trained into the
    drafter's state (weights, optimizer state, step count: kept for the next windows)."""
    with self._lock:
      windows, self._windows = self._windows, []
    self._stop.set()
    for w in windows:
      w.thread.join()
    if self._error is not None:
      err, self._error = self._error, None
      raise RuntimeError(f"Drafter spot training failed: {err}") from err
    trained = [w for w in windows if w.steps]
    if not trained:
      return
    params, opt_state = trained[0].params, trained[0].opt_state  # one window: as it is
    if len(trained) > 1:  # on the host: an average of device arrays would build programs
      merge = lambda *xs: jax.device_put(
          distributed.replica_mean(np.stack([np.asarray(x) for x in xs])), trained[0].device)
      params = jax.tree.map(merge, *[w.params for w in trained])
      opt_state = jax.tree.map(merge, *[w.opt_state for w in trained])
    self.trainer.load_state({"params": params, "opt_state": opt_state,
                             "step": self.trainer.step_count + sum(w.steps for w in trained)})

  @property
  def running(self) -> bool:
    """Whether a training window is open."""
    return bool(self._windows)
