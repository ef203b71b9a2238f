"""Shared fixtures: tiny random models built on the fly, float32 on CPU."""

import json
import os
import subprocess
import sys

# CPU unless the caller names a platform (`make test-gpu` sets JAX_PLATFORMS=cuda).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Nothing downloads in the tests: Hugging Face libraries read local folders only, at once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One OpenMP thread a process (PyTorch's, and OpenBLAS's, which read it; XLA:CPU does not use
# OpenMP): the suite's two workers fill both cores, and PyTorch's two OpenMP threads, spinning
# while they wait, took the other worker's core. Two `bench_served` commands (the served drafter's
# PyTorch loop) side by side took 142-170 s each, against 52 s with one thread; alone 46 s
# either way (docs/BENCHMARKS.md, "Compile time and the test suite").
os.environ.setdefault("OMP_NUM_THREADS", "1")

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

# The suite builds hundreds of small programs, and on CPU most of a test's time is LLVM compiling
# them. XLA's cheap optimisation level nearly halves that (a drafter test 76 s -> 46 s cold), and
# its older elemental emitters instead of the fusion emitters cut more (a drafter test 41 s ->
# 30 s cold); the programs run slower, which compile-bound tests barely feel
# (training-bound launchers run without them:
# `tests.test_launchers.run_module(fast_compile=False)`).
# What the tests assert (SD equals plain decoding, one device equals two, ...) compares programs
# built under the same flags, as on any backend. Subprocesses, and pytest-xdist workers, inherit
# the flags. XLA aborts on a flag it does not know, so the emitter flag is kept only where a probe
# process accepts it (a later XLA may drop it).
CHEAP_LEVEL = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
ELEMENTAL_EMITTERS = "--xla_cpu_use_fusion_emitters=false"


def _xla_accepts(flags: str) -> bool:
  env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip())
  probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                         capture_output=True, timeout=120)
  return probe.returncode == 0


# On a GPU the tests run under XLA's default flags, as users do; so does a test marked
# `xla_default` (`pytest_pyfunc_call` below), and everything when TLT_TESTS_XLA_DEFAULT=1.
if (os.environ["JAX_PLATFORMS"] == "cpu" and not os.environ.get("TLT_TESTS_XLA_DEFAULT")
    and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", "")):
  FAST_COMPILE = CHEAP_LEVEL
  if _xla_accepts(ELEMENTAL_EMITTERS):
    FAST_COMPILE = f"{CHEAP_LEVEL} {ELEMENTAL_EMITTERS}"
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()
  os.environ["TLT_TESTS_FAST_COMPILE"] = FAST_COMPILE  # what run_module(fast_compile=False) drops
FAST_COMPILE = os.environ.get("TLT_TESTS_FAST_COMPILE", CHEAP_LEVEL)

import jax
import pytest
from flax import nnx

from tlt_jax.models import ModelConfig, init_model


def pytest_collection_modifyitems(items):
  """Tests marked `long` run first, the rest in collection order: the slow suite's workers take
  tests in that order, and a long test handed out last keeps one worker busy while the other has
  nothing left. The fast suite's (`--dist loadfile`) take whole files, most tests first, which
  keeps its multi-device files apart (heavy files first ran them side by side, and slower)."""
  items.sort(key=lambda item: item.get_closest_marker("long") is None)


def pytest_pyfunc_call(pyfuncitem):
  """A test marked `xla_default` runs in a child pytest under XLA's default flags, as a user's
  run does: SmolLM2's bitwise claims in invariant numerics are checked under the emitters users
  get (in about the same time: docs/BENCHMARKS.md, "Compile time")."""
  if (pyfuncitem.get_closest_marker("xla_default") is None
      or FAST_COMPILE not in os.environ.get("XLA_FLAGS", "")):
    return None
  env = dict(os.environ, TLT_TESTS_XLA_DEFAULT="1",
             XLA_FLAGS=os.environ["XLA_FLAGS"].replace(FAST_COMPILE, "").strip())
  child = subprocess.run([sys.executable, "-m", "pytest", "-q", pyfuncitem.nodeid], cwd=_ROOT,
                         env=env, capture_output=True, text=True)
  if child.returncode != 0:
    pytest.fail(f"under XLA's default flags:\n{child.stdout[-6000:]}{child.stderr[-2000:]}",
                pytrace=False)
  return True


def small_config(**kw) -> ModelConfig:
  base = dict(vocab_size=53, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
              max_seq_len=64, rope_theta=10000.0)
  base.update(kw)
  return ModelConfig(**base)


@pytest.fixture
def small_model():
  return init_model(small_config(), seed=0)


# A model's forward, jitted: called eagerly, each of its ops builds its own program for each new
# shape, which made the model tests compile hundreds of programs.
jit_forward = nnx.jit(lambda model, *args, **kw: model(*args, **kw))


def lower_for_gpu(jitted, *args, mesh=None) -> str:
  """The StableHLO text of `jitted` on `args` lowered for CUDA on this machine, which has no GPU:
  from jax 0.11 Pallas's Triton lowering reads the target GPU from the abstract device of the
  mesh it was traced under, here an H100's (the kind the proof runs on), with the axes of
  `mesh` (the program's own; default one device)."""
  gpu = jax.sharding.AbstractDevice(device_kind="NVIDIA H100", num_cores=132, platform="gpu")
  axes = ((mesh.axis_sizes, mesh.axis_names, mesh.axis_types) if mesh is not None
          else ((1,), ("gpu",), (jax.sharding.AxisType.Auto,)))
  with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh(*axes, abstract_device=gpu)):
    return jitted.trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def run_on_fake_devices(module: str, devices: int = 2, timeout: int = 300) -> dict:
  """Runs `python -m module` with `devices` fake CPU devices; returns its last stdout line as
  JSON. A subprocess, because the device count is fixed when jax is first imported."""
  flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
  env = dict(os.environ, XLA_FLAGS=flags.strip(), JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-m", module], cwd=_ROOT, env=env, capture_output=True,
                        text=True, timeout=timeout)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])
