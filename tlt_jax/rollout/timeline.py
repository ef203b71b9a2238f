"""Timeline metrics of one `generate` call: dispatches, live batch over time, idle shards."""

from __future__ import annotations

import dataclasses
import time


@dataclasses.dataclass
class Event:
  """One engine dispatch of a rollout: prefill, decode (plain or a speculative arm) or
  compaction, on one shard, with its batch and the rows live before and after it."""

  shard: int
  kind: str          # prefill | decode | spec:<arm> | replay | compact
  start: float       # seconds since the call began
  end: float
  bucket: int
  live: int          # live rows when the event began
  steps: int = 0
  live_after: int = -1
  tokens: int = 0
  replayed: int = 0  # of `tokens`, those replay steps emitted from stored responses


class Timeline:
  """Collects events; `summary()` gives tokens/s, steps, time per bucket, idle time per shard."""

  def __init__(self, num_shards: int):
    self.t0 = time.perf_counter()
    self.events: list[Event] = []
    self.num_shards = num_shards
    self.shard_end = [None] * num_shards
    self.wall_s = 0.0
    self.tokens = 0
    self.compile_events, self.compile_s = 0, 0.0
    self.spec: dict = {}

  def record(self, shard, kind, start, end, bucket, live, steps=0, live_after=-1, tokens=0,
             replayed=0):
    """Adds one dispatch (`start`/`end` on the host's clock)."""
    self.events.append(Event(shard, kind, start - self.t0, end - self.t0, bucket, live, steps,
                             live_after, tokens, replayed))

  def shard_done(self, shard: int, at: float) -> None:
    """Marks when shard `shard` finished its last row."""
    self.shard_end[shard] = at - self.t0

  def finish(self, wall_s: float, tokens: int, compile_events: int, compile_s: float) -> None:
    """Closes the call: its wall time, tokens, and the XLA programs built during it."""
    self.wall_s, self.tokens = wall_s, tokens
    self.compile_events, self.compile_s = compile_events, compile_s
    self.shard_end = [wall_s if e is None else e for e in self.shard_end]

  def summary(self) -> dict:
    """Tokens per second, steps, decode and speculative time, time per bucket, speculative steps
    per arm, idle time per shard, the SD-on fraction, the share of tokens replayed and the
    compiles of the call."""
    per_bucket: dict[int, float] = {}
    per_arm: dict[str, int] = {}
    steps, spec_s, decode_s = 0, 0.0, 0.0
    for e in self.events:
      if e.kind in ("decode", "replay") or e.kind.startswith("spec"):
        per_bucket[e.bucket] = per_bucket.get(e.bucket, 0.0) + (e.end - e.start)
        steps += e.steps
        decode_s += e.end - e.start
      if e.kind.startswith("spec"):
        spec_s += e.end - e.start
        arm = e.kind.split(":", 1)[-1]
        per_arm[arm] = per_arm.get(arm, 0) + e.steps
    return {
        "wall_s": round(self.wall_s, 4),
        "tokens": self.tokens,
        "tokens_per_s": round(self.tokens / self.wall_s, 2) if self.wall_s else 0.0,
        "decode_dispatches": sum(e.kind in ("decode", "replay") or e.kind.startswith("spec")
                                 for e in self.events),
        "replay_fraction": (round(sum(e.replayed for e in self.events) / self.tokens, 4)
                            if self.tokens else 0.0),
        "sd_on_fraction": round(spec_s / decode_s, 4) if decode_s else 0.0,
        "decode_steps_max": steps,
        "spec_steps_per_arm": per_arm,  # speculative steps dispatched with each arm
        "time_per_bucket_s": {str(k): round(v, 4) for k, v in sorted(per_bucket.items())},
        "shard_idle_s": [round(self.wall_s - end, 4) for end in self.shard_end],
        "compile_events": self.compile_events,
        "compile_s": round(self.compile_s, 3),
        **({"spec": self.spec} if self.spec else {}),
    }
