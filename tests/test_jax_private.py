"""The package's only uses of JAX internals work on the installed JAX, and outside the tested
versions they say so in one line instead of failing somewhere inside JAX."""

import jax
import pytest

from tlt_jax import jax_private


def test_compile_options_for_a_device_assignment():
  ids = [d.id for d in jax.devices()[:1]]
  options = jax_private.compile_options(1, ids)
  assert options.executable_build_options.device_assignment.computation_count() == 1


def test_a_jax_outside_the_tested_range_is_one_line(monkeypatch):
  monkeypatch.setattr(jax, "__version__", "0.99.0")
  with pytest.raises(RuntimeError, match=r"jax 0.99.0 is outside the range .* install a jax"):
    jax_private.compile_options(1, [0])
  with pytest.raises(RuntimeError, match="outside the range"):
    jax_private.wait_at_barrier("x", 1000)
