"""The warm start shipped with the package: it is what `sft_tiny`'s recipe makes, it loads into
the `tiny` preset, and a config of another recipe never gets it."""

import json

import jax
import numpy as np
from flax import nnx

from experiments.configs import sft_tiny
from tlt_jax import sft
from tlt_jax.models import get_preset, init_model


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
  from tlt_jax.models.pretrained import save_pretrained
  from tlt_jax.tasks.tokenizer import CharTokenizer
  save_pretrained(model, CharTokenizer(32), str(tmp_path))
  with open(tmp_path / sft.RECIPE_FILE, "w") as f:
    json.dump({"recipe_digest": sft._digest(sft.recipe(c)), "summary": {}}, f)
  loaded, summary = sft.load_shipped(c, str(tmp_path))
  assert summary["shipped"]
  toks = jax.numpy.asarray([[1, 5, 6, 7]])
  np.testing.assert_array_equal(np.asarray(loaded(toks).logits_BxTxV),
                                np.asarray(model(toks).logits_BxTxV))
