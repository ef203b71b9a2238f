"""Sharding by logical axes: each weight's `PartitionSpec` for SmolLM2-135M's shape."""

import pytest
from flax import nnx

from tlt_jax.models import ModelConfig, abstract_model
from tlt_jax.models.sharding import check_tp, logical_axes, mesh_devices, spec

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


def test_the_update_mesh_spans_processes_with_tp_inside_one():
  """`mesh_devices` over 2 processes x 4 devices (named (process, device)): -1 takes every
  device, an explicit shape the same first devices of each process, tp stays in a process,
  fsdp crosses them; shapes the devices cannot hold are one-line errors."""
  groups = [[f"{p}:{d}" for d in range(4)] for p in range(2)]  # "process:device"
  mesh = mesh_devices((-1, 1, 1), groups)
  assert mesh.shape == (8, 1, 1) and list(mesh.reshape(-1)) == groups[0] + groups[1]
  fsdp = mesh_devices((1, 4, 1), groups)  # two devices of each process, fsdp across them
  assert list(fsdp.reshape(-1)) == ["0:0", "0:1", "1:0", "1:1"]
  tp = mesh_devices((1, -1, 2), groups)
  assert tp.shape == (1, 4, 2) and all(len({x[0] for x in pair}) == 1 for pair in tp[0])
  for shape, msg in (((3, 1, 1), "does not split evenly over the 2 processes"),
                     ((-1, 3, 1), "8 devices do not split into groups of 3"),
                     ((1, 1, 16), "needs 16 devices but 8 are visible"),
                     ((1, 1, 8), "tp=8 does not divide the 4 devices each process gives"),
                     ((-1, -1, 1), "at most one -1"), ((0, 1, 1), "Mesh axes must be >= 1")):
    with pytest.raises(ValueError, match=msg):
      mesh_devices(shape, groups)
