"""The scheduler serves the shard whose dispatch completes first, not shards in a fixed order."""

import types

from tlt_jax.rollout.scheduler import next_ready


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
