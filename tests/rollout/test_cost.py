"""The cost model's step-against-floor reading: fastest and median readings, consistent units."""

import pytest

from tests.conftest import small_config
from tlt_jax.models import init_model
from tlt_jax.rollout.cost import matmul_only_cost, param_bytes, step_against_floor


def test_step_against_floor_reports_fastest_and_median_readings():
  # ~12 MB of weights: a floor of a tenth of a millisecond, not rounded away.
  model = init_model(small_config(vocab_size=4096, d_model=256, d_ff=1024), seed=0)
  out = step_against_floor(model, cache_len=32, rounds=2, iters=3)
  assert 0 < out["step_ms_b1"] <= out["step_ms_b1_median"]
  assert 0 < out["floor_ms_b1"] <= out["floor_ms_b1_median"]
  # The floor is the model's bytes at the reported (fastest) bandwidth.
  floor_ms = 1e3 * param_bytes(model) / (out["bandwidth_gb_s"] * 1e9)
  assert out["floor_ms_b1"] == pytest.approx(floor_ms, rel=0.05, abs=0.01)


def test_matmul_only_cost_runs_the_model_weights(small_model):
  assert matmul_only_cost(small_model, batch=2, iters=2) > 0
