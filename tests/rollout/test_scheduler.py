"""The scheduler serves the shard whose dispatch completes first, not shards in a fixed order; its
dispatch policy (arms, replay, compaction, waves) works on host arrays alone."""

import types

import numpy as np

from tlt_jax.rollout.engine import EngineConfig
from tlt_jax.rollout.replay_choice import ReplayChoice
from tlt_jax.rollout.scheduler import Dispatch, Scheduler, ShardRun, next_ready, split_waves
from tlt_jax.rollout.timeline import Timeline
from tlt_jax.spec.controller import SpecController
from tlt_jax.spec.strategy import SpecConfig, Strategy


class _Flag:
  """An array stand-in that becomes ready after `polls` calls to `is_ready` (never if None)."""

  def __init__(self, polls):
    self.polls, self.calls = polls, 0

  def is_ready(self):
    self.calls += 1
    return self.polls is not None and self.calls > self.polls


def _run(polls):
  return types.SimpleNamespace(state=types.SimpleNamespace(done_B=_Flag(polls)))


def test_the_first_shard_to_complete_is_served_even_if_an_earlier_one_is_still_busy():
  runs = {0: _run(None), 1: _run(None), 2: _run(3)}
  assert next_ready(runs) == 2
  assert runs[2].state.done_B.calls == 4 and runs[0].state.done_B.calls == 4


def test_a_lone_shard_is_returned_at_once_without_polling():
  runs = {5: _run(None)}
  assert next_ready(runs) == 5 and runs[5].state.done_B.calls == 0


# ---------------------------------------------------------------- the dispatch policy, with no
# program: a fake state, the host arrays a dispatch would sync


def _scheduler(spec=None, chunk=0):
  cfg = EngineConfig(batch_buckets=(2, 4, 8), max_batch=8, prefill_buckets=(8,), corpus_len=4)
  controller = SpecController(spec, cfg.batch_buckets) if spec is not None else None
  return cfg, Scheduler(cfg, controller, ReplayChoice(chunk), lazy_follow=True)


def _shard_run(b, live, replaying=0):
  slots = np.concatenate([np.arange(live), np.full(b - live, -1)])
  return ShardRun(types.SimpleNamespace(), b, slots, live, np.zeros(b, np.int64),
                  np.zeros(b, np.int64), replaying=np.arange(b) < replaying,
                  replayed=np.zeros(b, np.int64))


def test_an_arm_is_chosen_below_the_threshold_and_plain_decoding_above_it():
  spec = SpecConfig(threshold=4, arms=(Strategy("suffix", 3, 3), Strategy("plain", 1, 0)),
                    epsilon=0.0)
  _, sched = _scheduler(spec)
  d = sched.choose(_shard_run(4, 3), compiling=False)
  assert (d.kind, d.arm, d.strategy.name) == ("spec:suffix_d3_n3", 0, "suffix_d3_n3")
  run = _shard_run(8, 6)
  assert sched.choose(run, compiling=True) == Dispatch("decode") and run.kind == "decode"
  assert run.apart == "compiling"  # its speed is not plain decoding's own


def test_a_replay_dispatch_while_half_the_live_rows_replay():
  _, sched = _scheduler(chunk=4)  # no cost table: replay while at least half the rows replay
  assert sched.choose(_shard_run(4, 4, replaying=2), compiling=False).kind == "replay"
  assert sched.choose(_shard_run(4, 4, replaying=1), compiling=False).kind == "decode"


def test_a_batch_compacts_one_bucket_at_a_time_to_the_smallest_that_holds_its_rows():
  _, sched = _scheduler()
  run = _shard_run(8, 8)
  done = np.array([0, 1, 1, 0, 1, 1, 1, 1], bool)  # slots 0 and 3 still decode
  timeline = Timeline(1)
  call = types.SimpleNamespace(timeline=timeline)
  run.t0 = 0.0
  synced = (done, np.full(8, 5), np.zeros(8, np.int64), np.zeros(8, bool), np.zeros(8, np.int64))
  live, finished = sched.settled(call, 0, run, synced)
  assert live.tolist() == [0, 3] and finished.tolist() == [1, 2, 4, 5, 6, 7]
  assert timeline.events[-1].tokens == 40 and timeline.events[-1].live_after == 2
  c = sched.compaction(run, live, done)
  assert (c.chain, c.b, c.idx.tolist()) == ([4, 2], 2, [0, 3, 1, 1])  # a done slot fills
  sched.compacted(run, c, len(live))
  assert run.b == 2 and run.slots.tolist() == [0, 3] and run.t.tolist() == [5, 5]
  assert sched.compaction(run, np.arange(2), done[:2]) is None  # at its bucket's edge: stays


def test_a_wave_shares_one_prompt_forward_among_its_samples():
  cfg, sched = _scheduler()
  prompts = [[5, 6, 7], [8, 9]]
  rows = [(i * 3 + g, i) for i in range(2) for g in range(3)]
  call = types.SimpleNamespace(
      prompts=prompts, rows=rows, waves=split_waves(cfg, 6), p_bucket=8,
      addresses=np.arange(6, dtype=np.int32)[:, None], replay=[None] * 6, corpus={},
      layout=types.SimpleNamespace(ctx_len=0, replay=False, n=4))
  wave = sched.wave(call, 0, pad_id=0)
  assert (wave.b, len(wave.rows)) == (8, 6) and not call.waves[0]
  prompts_np, lens_np, src_np, ids_np, active = wave.arrays[:5]
  assert lens_np.tolist()[:2] == [3, 2] and src_np.tolist()[:6] == [0, 0, 0, 1, 1, 1]
  assert ids_np[:, 0].tolist() == [0, 1, 2, 3, 4, 5, 0, 0] and active.sum() == 6
