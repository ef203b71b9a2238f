"""The GGUF reader against the `gguf` package's own writer and reader."""

import gguf
import numpy as np
import pytest

from tlt_jax.models.gguf_file import read_gguf
from tlt_jax.models.pretrained import load_gguf

QUANTS = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16,
          gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_1)


def _write(path) -> None:
  w = gguf.GGUFWriter(str(path), "llama")
  w.add_string("tokenizer.ggml.model", "gpt2")
  w.add_token_list(["a", "b c", "日本", "<|im_end|>"])
  w.add_token_types([1, 1, 1, 3])
  w.add_uint32("llama.block_count", 3)
  w.add_float32("llama.rope.freq_base", 10000.5)
  w.add_bool("general.flag", True)
  w.add_int64("general.big", -(2 ** 40))
  w.add_array("general.floats", [0.5, -1.25])
  w.add_custom_alignment(64)
  rng = np.random.default_rng(0)
  for i, kind in enumerate(QUANTS):
    x = rng.normal(size=(3, 64)).astype(np.float32)
    data = x.astype(np.float16) if kind == gguf.GGMLQuantizationType.F16 else (
        x if kind == gguf.GGMLQuantizationType.F32 else gguf.quants.quantize(x, kind))
    w.add_tensor(f"t{i}", data, raw_dtype=kind)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def test_read_gguf_reads_what_the_gguf_package_reads(tmp_path):
  path = tmp_path / "m.gguf"
  _write(path)
  ours, theirs = read_gguf(str(path)), gguf.GGUFReader(str(path))
  fields = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
  assert ours.metadata.keys() == fields.keys()
  for key, want in fields.items():
    got = ours.metadata[key]
    assert np.array_equal(np.float32(got), np.float32(want)) if key.endswith(("freq_base",
                                                                              "floats")) \
        else got == want, key
  assert ours.metadata["tokenizer.ggml.tokens"] == ["a", "b c", "日本", "<|im_end|>"]
  assert [t.name for t in theirs.tensors] == list(ours.tensors)
  for t in theirs.tensors:
    mine = ours.tensors[t.name]
    assert mine.type == t.tensor_type and mine.shape == (3, 64)
    np.testing.assert_array_equal(gguf.quants.dequantize(mine.data, mine.type),
                                  gguf.quants.dequantize(t.data, t.tensor_type))


@pytest.mark.parametrize("keep,message", [(100, "ends inside its header"),
                                          (-100, "runs past the end of the file")])
def test_a_cut_file_is_one_line_naming_it(tmp_path, keep, message):
  path = tmp_path / "m.gguf"
  _write(path)
  data = path.read_bytes()
  path.write_bytes(data[:keep])
  with pytest.raises(ValueError, match=message):
    read_gguf(str(path))
  with pytest.raises(ValueError, match=r"m.gguf could not be read as GGUF .*; the file is corrupt"):
    load_gguf(str(path))
