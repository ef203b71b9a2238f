"""Run directories go through `tlt_jax.paths`: local folders absolute and normalised, remote ones
(`gs://`) as given, files written whole; a logger that cannot write remotely is refused early."""

import importlib
import os
import threading
import time

import numpy as np
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from safetensors.numpy import load_file

from tests.rl.test_trainer import engine, workload
from tlt_jax.paths import as_path, exclusive, write_safetensors, write_whole
from tlt_jax.rl.compare import read_metrics
from tlt_jax.rl.grpo import GRPOConfig
from tlt_jax.rl.metrics import RunWriter
from tlt_jax.rl.trainer import LoopConfig, Trainer
from tlt_jax.rl.update import OptimConfig


def test_a_local_path_is_absolute_and_normalised_and_a_remote_one_is_kept(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert str(as_path("runs/../runs/a")) == str(tmp_path / "runs" / "a")
  assert as_path("runs/a") == as_path(tmp_path / "runs" / "a")
  assert str(as_path("gs://bucket/runs/a")) == "gs://bucket/runs/a"
  remote = as_path("gs://bucket/runs") / "a" / "metrics.jsonl"
  assert str(remote) == "gs://bucket/runs/a/metrics.jsonl"


def test_files_are_written_whole_and_read_back(tmp_path):
  path = as_path(tmp_path) / "costs.json"
  write_whole(path, '{"a": 1}')
  write_whole(path, b'{"a": 2}')
  assert path.read_text() == '{"a": 2}' and os.listdir(tmp_path) == ["costs.json"]
  # A transposed view is written in its own order, not its buffer's.
  tensors = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "t": np.arange(6.0).reshape(2, 3).T}
  write_safetensors(tensors, as_path(tmp_path) / "model.safetensors", {"format": "pt"})
  back = load_file(tmp_path / "model.safetensors")
  np.testing.assert_array_equal(back["w"], tensors["w"])
  np.testing.assert_array_equal(back["t"], tensors["t"])


def test_weights_and_biases_with_a_remote_run_directory_is_refused_before_work():
  pytest.importorskip("wandb")
  with pytest.raises(ValueError, match="gs://bucket/run is not local; log to tensorboard only"):
    LoopConfig("gs://bucket/run", 1, 4, 4, loggers=("wandb",))


@pytest.fixture
def memory_bucket(monkeypatch):
  """`gs://` paths served by fsspec's in-memory filesystem: a stand-in for a remote bucket that
  needs no network (the files never touch the local disk) and, like GCS, cannot append."""
  registry = importlib.import_module("fsspec.registry")  # `fsspec.registry` is a read-only view

  class Bucket(MemoryFileSystem):
    protocol = ("gs", "gcs")
    store, pseudo_dirs = {}, [""]

    def _open(self, path, mode="rb", **kwargs):
      if "a" in mode:  # as GCS: an object is written whole, never appended to
        raise NotImplementedError("no append on an object store")
      return super()._open(path, mode, **kwargs)

  for name in Bucket.protocol:
    monkeypatch.setitem(registry._registry, name, Bucket)
  yield Bucket.store


def test_a_run_writes_its_records_into_a_remote_run_directory(memory_bucket, tmp_path):
  """A trainer run whose out_dir is `gs://...` (in memory, without append, as GCS): its warm-up
  report and step records land there and read back, a resumed writer adds to them (rewriting
  each object with its earlier lines first), and nothing is written locally under that name."""
  tr = Trainer(workload(), LoopConfig("gs://bucket/run", 2, prompts_per_step=4, group_size=4,
                                      loggers=()),
               engine_cfg=engine(), learner=GRPOConfig(),
               optim=OptimConfig(lr=1e-2, warmup_steps=0, total_steps=10))
  hist = tr.run(progress=False)
  steps = [m["step"] for m in read_metrics("gs://bucket/run")]
  assert steps == [m["step"] for m in hist] == [0, 1]
  assert {f"gs://bucket/run/{name}" for name in ("metrics.jsonl", "rollouts.jsonl", "eval.jsonl",
                                                  "warmup.json")} <= set(memory_bucket)
  writer = RunWriter("gs://bucket/run", resumed=True, loggers=())
  writer.step({"step": 2, "reward": 0.0}, {"events": []})
  writer.close()
  assert [m["step"] for m in read_metrics("gs://bucket/run")] == [0, 1, 2]
  assert not os.path.exists("gs:")


def test_a_cache_entry_is_held_by_one_builder_at_a_time(tmp_path):
  """A second holder of the entry's lock (another process or thread sharing the cache) waits
  until the first has built it."""
  order, held = [], threading.Event()

  def first():
    with exclusive(tmp_path / "cache" / "entry"):
      held.set()
      time.sleep(0.3)
      order.append("first built it")

  thread = threading.Thread(target=first)
  thread.start()
  held.wait()
  with exclusive(tmp_path / "cache" / "entry"):
    order.append("second found it")
  thread.join()
  assert order == ["first built it", "second found it"]
