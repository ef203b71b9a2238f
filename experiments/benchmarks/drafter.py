"""The adaptive-drafter benchmark: the policy drifts over RL steps; the same prompts are rolled out
with the warm-up drafter kept frozen and with the adaptive drafter (spot training + publishing).

With the `coupled` rule the two runs sample the same tokens, so their policies are identical at
every step and the drafters are compared on the same final policy.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from tlt_jax.drafter.buffer import BufferConfig, DataBuffer
from tlt_jax.drafter.proposer import EagleProposer
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.spec.strategy import SpecConfig, Strategy


def accept_len(policy, drafter, prompts, group_size: int, params, engine_cfg: EngineConfig,
               depth: int, pad_id: int, seed: int = 0):
  """Mean accepted tokens per verify step of `drafter` on `policy`, speculating at every batch
  size (one EAGLE arm of `depth`, coupled rule, no health retirement); also returns the rollout
  (with captured hidden states)."""
  spec = SpecConfig(threshold=engine_cfg.max_batch, rule="coupled", epsilon=0.0,
                    min_accept_len=0.0, arms=(Strategy("eagle", depth, 0),))
  cfg = dataclasses.replace(engine_cfg, num_shards=1, precompile=False)
  engine = RolloutEngine(policy, cfg, pad_id=pad_id, spec=spec, drafter=EagleProposer(drafter))
  res = engine.generate(prompts, group_size, params, jax.random.key(seed), capture_hidden=True)
  return float(engine.spec.accept_len()), res


def hidden_state_error(policy, prompts, group_size: int, result, rows: int = 16) -> float:
  """Max |captured hidden - full forward| over every position of the first `rows` rows."""
  buf = DataBuffer(BufferConfig(max_tokens=int(result.lengths.sum()) + len(result.lengths)),
                   policy.cfg.d_model, policy.cfg.dtype)
  buf.add_rollout(prompts, group_size, result, 0, 0)
  worst = 0.0
  for i, seg in enumerate(buf.segments()[:rows]):
    p = prompts[i // group_size]
    full = list(p) + result.response(i)
    want = policy(jnp.asarray([full])).hidden_BxTxD[0, len(p) - 1:]
    worst = max(worst, float(np.abs(buf.hidden(seg) - np.asarray(want)).max()))
  return worst


