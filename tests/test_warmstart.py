"""The warm start and the demo's drafter shipped with the package: the warm start is what
`sft_tiny`'s recipe makes, it loads into the `tiny` preset, and a config of another recipe never
gets it; the demo's warm-up finds its drafter shipped, and a shipped drafter loads exactly."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from experiments.configs import demo, sft_tiny
from tests.conftest import small_config
from tlt_jax import sft
from tlt_jax.drafter import warmup
from tlt_jax.drafter.model import DrafterConfig, init_drafter
from tlt_jax.hashing import content_digest
from tlt_jax.models import get_preset, init_model
from tlt_jax.models.pretrained import save_pretrained
from tlt_jax.models.tokenizer import CharTokenizer
from tlt_jax.workloads import build_drafter, drafter_key, drafter_recipe, workload_config


def test_the_shipped_warm_start_is_sft_tiny_s_recipe_on_the_tiny_preset():
  model, summary = sft.warm_start(sft_tiny.get_config())
  assert summary["shipped"] and summary["cache"] == sft.SHIPPED_DIR
  want = nnx.state(init_model(get_preset("tiny"), seed=0))
  got = nnx.state(model)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert a.shape == b.shape and a.dtype == b.dtype
  assert model.cfg == get_preset("tiny")
  with open(f"{sft.SHIPPED_DIR}/{sft.RECIPE_FILE}") as f:
    assert json.load(f)["command"] == "make warmstart"


def test_another_recipe_is_not_given_the_shipped_weights(tmp_path):
  c = sft_tiny.get_config()
  c.train.steps = 699
  assert sft.load_shipped(c) is None
  c = sft_tiny.get_config()
  c.seed = 1
  assert sft.load_shipped(c) is None


def test_a_shipped_folder_round_trips_through_save_pretrained(tmp_path):
  c = sft_tiny.get_config("small")
  model = init_model(get_preset("tiny"), seed=3)
  save_pretrained(model, CharTokenizer(32), str(tmp_path))
  with open(tmp_path / sft.RECIPE_FILE, "w") as f:
    json.dump({"recipe_digest": content_digest(sft.recipe(c)), "summary": {}}, f)
  loaded, summary = sft.load_shipped(c, str(tmp_path))
  assert summary["shipped"]
  toks = jax.numpy.asarray([[1, 5, 6, 7]])
  np.testing.assert_array_equal(np.asarray(loaded(toks).logits_BxTxV),
                                np.asarray(model(toks).logits_BxTxV))


def test_the_demo_s_warm_up_drafter_is_shipped():
  c = demo.get_config("drafter")
  wc, recipe = workload_config(c), drafter_recipe(c.drafter, ("adaptive", "eval_prompts"))
  key = drafter_key(wc, recipe, c.seed)
  shipped = warmup.shipped_drafters()
  assert sorted(os.listdir(warmup.SHIPPED_ROOT)) == sorted(shipped) == [
      "demo", "smollm2", "smollm2_eagle"]
  assert shipped["demo"]["key"] == key and "demo.py:drafter" in shipped["demo"]["command"]
  drafter, meta = build_drafter(wc, recipe, c.seed, progress=False)
  assert meta["shipped"] and meta["key"] == key and meta["top1_agreement"] > 0.5
  assert meta["cache"] == warmup.resolve_drafter("demo")
  assert drafter.target_cfg == get_preset("tiny")
  with pytest.raises(FileNotFoundError, match="shipped names"):
    warmup.resolve_drafter("llama-70b")


def test_a_shipped_drafter_loads_exactly_and_only_for_its_target(tmp_path):
  target = init_model(small_config(), seed=0)
  drafter = init_drafter(target.cfg, DrafterConfig(feature_layers=(0, 1, 2)), seed=1)
  warmup.save_drafter(drafter, str(tmp_path / "cache"), {"loss": 1.5})
  shipped = warmup.ship_drafter(str(tmp_path / "cache"), "mine", "k", "python -m x",
                                str(tmp_path / "assets"))
  assert warmup.shipped_drafters(str(tmp_path / "assets")) == {
      "mine": {"key": "k", "command": "python -m x"}}
  assert warmup.resolve_drafter("mine", str(tmp_path / "assets")) == shipped
  loaded, meta = warmup.load_any_drafter(shipped, target)
  assert meta == {"loss": 1.5} and loaded.cfg == drafter.cfg
  for a, b in zip(jax.tree.leaves(nnx.state(loaded, nnx.Param)),
                  jax.tree.leaves(nnx.state(drafter, nnx.Param))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(ValueError, match="made for another target"):
    warmup.load_shipped_drafter(shipped, init_model(small_config(d_model=16), seed=0))
