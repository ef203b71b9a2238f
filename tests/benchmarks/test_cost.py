"""The cost model: step-against-floor readings (fastest and median, consistent units), the
matrix-product chain on fused and separate kernels, and what speculation must accept to pay."""

import jax
import numpy as np
import pytest

from tests.conftest import small_config
from tlt_jax.models import init_model
from experiments.benchmarks.cost import (matmul_only_cost, param_bytes, product_chain,
                                  speculation_bound, step_against_floor)


def test_step_against_floor_reports_fastest_and_median_readings():
  # ~12 MB of weights: a floor of a tenth of a millisecond, not rounded away.
  model = init_model(small_config(vocab_size=4096, d_model=256, d_ff=1024), seed=0)
  out = step_against_floor(model, cache_len=32, rounds=2, iters=3)
  assert 0 < out["step_ms_b1"] <= out["step_ms_b1_median"]
  assert 0 < out["floor_ms_b1"] <= out["floor_ms_b1_median"]
  # The floor is the model's bytes at the reported (fastest) bandwidth.
  floor_ms = 1e3 * param_bytes(model) / (out["bandwidth_gb_s"] * 1e9)
  assert out["floor_ms_b1"] == pytest.approx(floor_ms, rel=0.05, abs=0.01)


@pytest.mark.parametrize("tied", [True, False])
def test_product_chain_is_the_same_function_on_fused_and_separate_kernels(tied):
  model = init_model(small_config(tie_embeddings=tied), seed=1)
  x = jax.random.normal(jax.random.key(0), (2, model.cfg.d_model))
  (fused, fused_args), (sep, sep_args) = product_chain(model, True), product_chain(model, False)
  assert [len(k[0]) + len(k[2]) for k in fused_args[0]] == [2] * model.cfg.n_layers
  assert [len(k[0]) + len(k[2]) for k in sep_args[0]] == [5] * model.cfg.n_layers
  out = fused(*fused_args, x)
  assert out.shape == (2, model.cfg.vocab_size)
  np.testing.assert_allclose(out, sep(*sep_args, x), rtol=1e-5, atol=1e-5)
  # The same products through the model's own modules (its MLP and head included).
  g, ref = model.cfg.n_heads // model.cfg.n_kv_heads, x
  for blk in model.layers:
    qkv = blk.attn.qkv_proj(ref)  # [B, K, G + 2, H]
    q, kv = qkv[:, :, :g].reshape(2, -1), qkv[:, :, g:].reshape(2, -1)
    ref = ref + blk.attn.o_proj(q + kv.mean(-1, keepdims=True))
    ref = ref + blk.mlp(ref)
  np.testing.assert_allclose(out, model.head(ref[:, None])[:, 0], rtol=1e-5, atol=1e-5)
  assert matmul_only_cost(model, batch=2, iters=2, fused=False) > 0


def test_speculation_bound_from_measured_costs():
  table = [{"B": 1, "T": 1, "ms": 10.0}, {"B": 1, "T": 4, "ms": 17.0},
           {"B": 2, "T": 1, "ms": 20.0}, {"B": 2, "T": 4, "ms": 24.0},
           {"B": 4, "T": 4, "ms": 30.0}]  # no c(4, 1): nothing to compare with
  rows = speculation_bound(table, {1: 0.13}, target_speedup=1.8)  # a draft step: 1.3 ms
  assert [(r["B"], r["depth"]) for r in rows] == [(1, 3), (2, 3)]
  b1, b2 = rows
  # Batch 1: verifying 4 tokens costs 1.7 steps; three draft steps add 0.39.
  assert b1["verify_x"] == 1.7 and b1["draft_x"] == 0.13 and b1["max_accept"] == 4
  assert b1["accept_needed_free"] == 3.06            # 1.8 x 17 / 10
  assert b1["accept_needed_drafter"] == 3.76         # 1.8 x (17 + 3 x 1.3) / 10
  assert b1["ceiling_free"] == round(40 / 17, 3)
  assert b1["ceiling_drafter"] == round(40 / 20.9, 3)
  # Batch 2 has no drafter cost: only the model-free figures.
  assert b2["accept_needed_free"] == 2.16 and b2["ceiling_free"] == round(80 / 24, 3)
  assert "accept_needed_drafter" not in b2 and "ceiling_drafter" not in b2
