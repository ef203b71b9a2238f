"""What the drafter package may read of a rollout engine and publish to it, and nothing else:
the devices its hidden states are captured on (and the idle windows' devices), their width and
dtype, the batch buckets a rollout harvests at, the target's embedding and head as each shard
holds them, with their graph definition (`models.transformer.token_view`), the draft model's
graph definition (to score a candidate as the engine would run it), and the drafter versions:
read the one in use, install a new one on every shard."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class DrafterPort:
  """An engine as the drafter package sees it (`RolloutEngine.drafter_port()`)."""

  devices: tuple                 # one per rollout shard (where its host work and windows go)
  hidden_width: int              # D of the captured hidden states
  hidden_dtype: str              # their dtype: the target's compute dtype
  harvest_buckets: tuple         # batch buckets a call can harvest rows at
  token_graphdef: object         # the target's embedding and head (`token_view`)
  drafter_graphdef: object
  _weights: object               # the engine's WeightStore: versions live there

  @property
  def drafter_version(self) -> int:
    """The version of the drafter every shard verifies with."""
    return self._weights.drafter_version

  def token_params(self, shard: int):
    """The policy's embedding and head as shard `shard` holds them, whole on that shard's device
    (`devices[shard]`): what the drafter trains and checks against, never gathered from the
    update's layout (`WeightStore.token_params`)."""
    return self._weights.token_params(shard)

  def publish(self, params, version: int | None = None) -> None:
    """Installs drafter `params` on every shard (as `version`, default the next)."""
    self._weights.set_drafter(params, version)

  def warm_up_publish(self, params) -> None:
    """Builds the casts `publish` runs on weights like `params` (installing nothing): in a bf16
    run the shipped drafter arrives in bf16 and the first trained one in float32."""
    self._weights.drafter_copy(params)
