"""The weights a rollout runs with: the policy's and the draft model's, one copy per shard
(each shard a sub-mesh: `rollout/shards.py`), laid out on the shard's devices by their logical
axes (`models/sharding.py`: heads and MLP split over the shard's `tp` devices).

The policy may come from a model on this process's devices or from the update's state spanning
processes: then it is resharded straight into the shards' layouts where the update's devices are
the shards' (`rollout/reshard.py`), and only otherwise gathered whole on this process's first
device first (`distributed.local_copy`). `sync_bytes` is what the last installation brought to
this process's devices.

The store keeps them in the model's compute dtype (`models/precision.py`): a bf16 run's policy is
cast from its float32 master copy once per sync, not once per step. Weights enter the compiled
programs as arguments, so installing new ones (the policy after each
update, a drafter version the publisher accepted) compiles nothing. The store keeps the one
drafter version counter: a publisher installs through it and reads its version from it, and
checkpoints record it.
"""

from __future__ import annotations

import jax
from jax.sharding import Mesh, NamedSharding

from tlt_jax import distributed
from tlt_jax.models.precision import compute_copy
from tlt_jax.models.sharding import param_shardings
from tlt_jax.models.transformer import token_state
from tlt_jax.rollout.reshard import Resharder, moved_bytes
from tlt_jax.rollout.shards import placed_shapes, replicated


def _abstract(state):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)


class WeightStore:
  """Per-shard copies of the policy's and (optionally) the draft model's weights, in `dtype`
  (the models' compute dtype)."""

  def __init__(self, meshes: list[Mesh], policy_state, drafter_state=None, dtype="float32"):
    self.meshes, self.dtype = list(meshes), dtype
    self.drafter_version = 0
    self.sync_bytes = 0
    self._resharder = Resharder(self.meshes, dtype)
    self._drafter, self._abstract_drafter = None, None
    self.set_policy(policy_state)
    if drafter_state is not None:
      self._drafter = []
      self.set_drafter(drafter_state)

  def set_policy(self, state) -> None:
    """Installs new policy weights on every shard: a model's state, or the update's (which may
    span processes); records the bytes this brought to this process's devices."""
    spanning = not all(x.is_fully_addressable for x in jax.tree.leaves(state))
    shards = self._resharder(state) if spanning else None
    if shards is not None:
      self.sync_bytes = moved_bytes(state, self._resharder.placed(state))
    else:
      self.sync_bytes = 0
      if spanning:  # the update's devices are not the shards': gathered on one device first
        mesh = jax.tree.leaves(state)[0].sharding.mesh
        whole = jax.tree.map(lambda x: replicated(mesh), state)
        self.sync_bytes = moved_bytes(state, placed_shapes(_abstract(state), whole))
        state = distributed.local_copy(state, mesh)
      copy = compute_copy(state, self.dtype)
      shards = []
      for mesh in self.meshes:
        shardings = param_shardings(copy, mesh)
        shards.append(jax.device_put(copy, shardings))
        self.sync_bytes += moved_bytes(state, placed_shapes(_abstract(copy), shardings))
    self._abstract_policy = _abstract(shards[0])
    self._policy = shards

  def set_drafter(self, state, version: int | None = None) -> None:
    """Installs drafter weights on every shard (between dispatches: never mid-verification) as
    `version`, by default the next one."""
    if self._drafter is None:
      raise ValueError("This engine was built without a drafter.")
    state = self.drafter_copy(state)
    self._abstract_drafter = _abstract(state)
    self._drafter = [jax.device_put(state, param_shardings(state, mesh)) for mesh in self.meshes]
    self.drafter_version = self.drafter_version + 1 if version is None else version

  def drafter_copy(self, state):
    """Drafter weights as the shards hold them (`compute_copy`): a trained drafter's float32
    weights cast to the compute dtype, one program per weight shape, which a warm-up builds by
    calling this on the trainer's weights."""
    return compute_copy(state, self.dtype)

  def sharding(self, s: int) -> NamedSharding:
    """Where shard `s`'s inputs (and decode state, but for its KV cache) live: whole on each of
    its devices."""
    return replicated(self.meshes[s])

  def shard(self, s: int) -> tuple:
    """(policy, drafter or None) on shard `s`: a program's first argument."""
    return self._policy[s], self._drafter[s] if self._drafter is not None else None

  def token_params(self, s: int):
    """The policy's embedding and head (`models.transformer.token_state`), in the compute dtype,
    whole on shard `s`'s first device: the shard's own arrays when its `tp` is 1 (nothing is
    copied), else gathered there from its `tp` devices (the vocabulary splits over them)."""
    return jax.device_put(token_state(self._policy[s]), self.meshes[s].devices.flat[0])

  def abstract(self, s: int) -> tuple:
    """Shapes, dtypes and shardings of `shard(s)`, for compiling ahead of time."""
    place = lambda a: None if a is None else placed_shapes(a, param_shardings(a, self.meshes[s]))
    return place(self._abstract_policy), place(self._abstract_drafter)
