"""Fake CPU devices for the launchers that shard a rollout (or a process) over several devices on
a CPU machine: XLA's `--xla_force_host_platform_device_count`, which must be in `XLA_FLAGS`
before jax is imported. Standard library only, so a launcher can call it first."""

import os

_FLAG = "--xla_force_host_platform_device_count"


def xla_flags(count: int, flags: str | None = None) -> str:
  """`flags` (default: the environment's `XLA_FLAGS`) with `count` fake CPU devices, unless they
  already name a device count."""
  flags = os.environ.get("XLA_FLAGS", "") if flags is None else flags
  return flags if _FLAG in flags else f"{flags} {_FLAG}={count}".strip()


def use(count: int) -> None:
  """This process sees `count` CPU devices (call it before jax is imported)."""
  os.environ["XLA_FLAGS"] = xla_flags(count)
