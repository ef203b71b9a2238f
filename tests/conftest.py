"""Shared fixtures: tiny random models built on the fly, float32 on CPU."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

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
