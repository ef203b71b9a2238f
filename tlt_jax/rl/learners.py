"""The learners by name: `rl.learner` in a run config picks one, `rl.<name>` holds its settings."""

from __future__ import annotations

from tlt_jax.errors import ConfigError
from tlt_jax.rl.dapo import DAPOConfig
from tlt_jax.rl.grpo import GRPOConfig
from tlt_jax.rl.gspo import GSPOConfig
from tlt_jax.rl.learner import Learner
from tlt_jax.typed import typed

LEARNERS = {cls.name: cls for cls in (GRPOConfig, GSPOConfig, DAPOConfig)}


def learner_from_section(rl) -> Learner:
  """The learner a run config's `rl` section names (`rl.learner`, default "grpo"), built from its
  settings (`rl.<name>`; absent or empty: the learner's defaults)."""
  name = rl.get("learner", "grpo")
  if name not in LEARNERS:
    raise ConfigError(f"config.rl.learner={name!r} is not a learner; available: "
                      f"{', '.join(sorted(LEARNERS))}.")
  return typed(LEARNERS[name], rl.get(name), f"rl.{name}")
