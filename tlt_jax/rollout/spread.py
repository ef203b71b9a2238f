"""A rollout spread over the processes of a run (`tlt_jax.distributed`): each process generates
its contiguous share of the prompts on its own devices, then one collective gives every process
every row.

The sample ids of a process's rows are those its rows have when one process generates them all
(`generate(..., first_sample=)`), and the engine's randomness is addressed by sample id, so the
tokens do not depend on how many processes share the work. In one process this is the engine's
own `generate`, with nothing gathered.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from tlt_jax import distributed
from tlt_jax.rollout.engine import RolloutEngine, RolloutResult


@dataclasses.dataclass
class Spread:
  """`whole`: every row, in sample order, on every process (no hidden states: they stay where
  they were captured); `local` and `prompts`: this process's own result and prompts; the
  seconds and bytes of the gather."""

  whole: RolloutResult
  local: RolloutResult
  prompts: list
  collective_s: float = 0.0
  collective_bytes: int = 0


def generate_spread(engine: RolloutEngine, prompts: list, group_size: int, params, key, *,
                    addresses=None, replay: list | None = None, corpus: dict | None = None,
                    **kw) -> Spread:
  """`engine.generate` of this process's share of `prompts` x `group_size`, gathered.
  `addresses` and `replay` (by row) and `corpus` (by prompt index) are the whole request's;
  each process passes the engine its own rows' and prompts'."""
  share = distributed.share(len(prompts))
  mine = prompts[share]
  rows = slice(share.start * group_size, share.stop * group_size)
  local = engine.generate(
      mine, group_size, params, key, first_sample=share.start * group_size,
      addresses=None if addresses is None else np.asarray(addresses)[rows],
      replay=None if replay is None else replay[rows],
      corpus={q - share.start: text for q, text in (corpus or {}).items()
              if share.start <= q < share.stop}, **kw)
  if jax.process_count() == 1:
    return Spread(local, local, mine)
  t0 = time.perf_counter()
  rows = distributed.gather_rows(_rows(local.tokens, local.logprobs, local.lengths,
                                       [r == "stop" for r in local.stop_reasons]),
                                 len(prompts) * group_size)
  reasons = ["stop" if s else "length" for s in rows["stopped"]]
  whole = RolloutResult(rows["tokens"], rows["logprobs"], rows["lengths"], reasons, None,
                        local.timeline)
  return Spread(whole, local, mine, time.perf_counter() - t0,
                sum(v.nbytes for v in rows.values()))


def warm_up_spread(prompts: int, group_size: int, max_new_tokens: int) -> None:
  """Builds the gather of `generate_spread` for `prompts` x `group_size` rows (nothing to
  build in one process)."""
  if jax.process_count() > 1:
    n = prompts * group_size // jax.process_count()
    distributed.gather_rows(_rows(np.zeros((n, max_new_tokens), np.int32),
                                  np.zeros((n, max_new_tokens), np.float32),
                                  np.zeros(n, np.int32), np.zeros(n, bool)), prompts * group_size)


def _rows(tokens, logprobs, lengths, stopped) -> dict:
  return {"tokens": np.asarray(tokens, np.int32), "logprobs": np.asarray(logprobs, np.float32),
          "lengths": np.asarray(lengths, np.int32), "stopped": np.asarray(stopped, bool)}
