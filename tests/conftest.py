"""Shared fixtures: tiny random models built on the fly, float32 on CPU."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# One persistent compilation cache for the whole suite, shared with the launchers the tests start
# (they inherit the environment) and between `make test` and `make test-slow`: many tests and
# subprocesses compile the same programs. Small programs are cached too. No size bound: with one,
# JAX rescans the whole directory on every write, which made the suite twice as slow. An entry that
# a parallel worker (pytest -n) reads half written fails to decompress, and JAX then compiles
# instead (it catches and logs the error).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_ROOT, ".cache", "jax-tests"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pytest

from tlt_jax.models import ModelConfig, init_model


def small_config(**kw) -> ModelConfig:
  base = dict(vocab_size=53, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
              max_seq_len=64, rope_theta=10000.0)
  base.update(kw)
  return ModelConfig(**base)


@pytest.fixture
def small_model():
  return init_model(small_config(), seed=0)


def run_on_fake_devices(module: str, devices: int = 2, timeout: int = 300) -> dict:
  """Runs `python -m module` with `devices` fake CPU devices; returns its last stdout line as
  JSON. A subprocess, because the device count is fixed when jax is first imported."""
  import json
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
             JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-m", module], cwd=root, env=env, capture_output=True,
                        text=True, timeout=timeout)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])
