"""Sharding by logical axes: each weight's `PartitionSpec` for SmolLM2-135M's shape."""

import pytest
from flax import nnx

from tlt_jax.models import ModelConfig, abstract_model
from tlt_jax.models.sharding import check_tp, logical_axes, spec

# SmolLM2-135M: 30 layers, width 576, 9 query / 3 kv heads of 64, MLP 1536, 49152 tokens.
SMOLLM2 = ModelConfig(vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3,
                      d_ff=1536, head_dim=64, rope_layout="interleaved", max_seq_len=2048)


def _specs(cfg, mesh_shape):
  _, state = nnx.split(abstract_model(cfg), nnx.Param)
  return {".".join(map(str, p)): (tuple(v.get_value().shape),
                                  spec(logical_axes(v), v.get_value().shape, mesh_shape))
          for p, v in nnx.to_flat_state(state)}


def test_every_weight_of_smollm2_splits_over_tp_and_fsdp():
  specs = _specs(SMOLLM2, {"data": 1, "fsdp": 2, "tp": 3})  # tp = 3 divides its 3 kv heads
  for name, (shape, s) in specs.items():
    if name.startswith("layers.0.") or not name.startswith("layers."):
      print(f"{name:40s} {str(shape):22s} {s}")
  want = {"embed.embedding": ("tp", "fsdp"), "final_norm.scale": (None,),
          "attn.qkv_proj.kernel": ("fsdp", "tp", None, None), "attn.o_proj.kernel": ("tp", "fsdp"),
          "mlp.gate_up_proj.kernel": ("fsdp", None, "tp"), "mlp.down_proj.kernel": ("tp", "fsdp"),
          "input_norm.scale": (None,), "post_attn_norm.scale": (None,)}
  for name, (_, s) in specs.items():
    key = name if not name.startswith("layers.") else name.split(".", 2)[2]
    assert tuple(s) == want[key], name
  assert len(specs) == 2 + 6 * SMOLLM2.n_layers  # nothing left out of the table


def test_tp_that_does_not_divide_the_heads_is_a_clear_error():
  check_tp(SMOLLM2, 3)
  with pytest.raises(ValueError, match=r"tp=2 does not divide the model's n_kv_heads=3;?"):
    check_tp(SMOLLM2, 2)
  with pytest.raises(ValueError, match="n_kv_heads=3 and d_ff=1536"):
    check_tp(SMOLLM2, 5)
  # Under tp = 2 the 3 kv heads cannot split (the engine and the update refuse it, above); the
  # weights whose axes tp divides still split, and no dimension splits unevenly.
  specs = _specs(SMOLLM2.replace(n_layers=1), {"data": 1, "fsdp": 2, "tp": 2})
  for name, (shape, s) in specs.items():
    print(f"{name:40s} {str(shape):22s} {s}")
  assert tuple(specs["layers.0.attn.qkv_proj.kernel"][1]) == ("fsdp", None, None, None)
  assert tuple(specs["layers.0.mlp.gate_up_proj.kernel"][1]) == ("fsdp", None, "tp")
  assert tuple(specs["layers.0.mlp.down_proj.kernel"][1]) == ("tp", "fsdp")
  assert tuple(specs["embed.embedding"][1]) == ("tp", "fsdp")
