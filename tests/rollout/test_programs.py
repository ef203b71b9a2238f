"""The executable pool's key covers the code a rollout program traces and nothing else: an edit to
a traced layer gives new keys (no stale program is ever loaded), an edit to the trainer keeps the
cached programs; a row's cache is as short as its layout allows."""

import dataclasses
import importlib
import pathlib
import shutil
import sys

from tlt_jax.rollout.engine import EngineConfig
from tlt_jax.rollout.programs import (TRACED_PACKAGES, cache_length, registered_source_digest,
                                      traced_source_digest)
from tlt_jax.spec import proposer
from tlt_jax.spec.strategy import SpecConfig, Strategy

ROOT = pathlib.Path(__file__).resolve().parents[2] / "tlt_jax"


def test_the_fingerprint_follows_the_traced_code_only(tmp_path):
  copy = tmp_path / "tlt_jax"
  shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__", "assets"))
  before = traced_source_digest(copy)
  assert before == traced_source_digest(ROOT)  # the digest reads the source, not the location
  trainer = copy / "rl" / "trainer.py"
  trainer.write_text(trainer.read_text() + "\n# an edit outside the traced layers\n")
  assert traced_source_digest(copy) == before
  for package, name in (("models", "layers.py"), ("kernels", "attention.py"),
                        ("rollout", "state.py"), ("drafter", "follow.py")):
    assert package in TRACED_PACKAGES
    f = copy / package / name
    text = f.read_text()
    f.write_text(text.replace("return", "return  ", 1))  # the same program, other source
    assert traced_source_digest(copy) != before, f
    f.write_text(text)
  assert traced_source_digest(copy) == before


PROPOSER_MODULE = '''
import jax.numpy as jnp

from tlt_jax.spec.drafts import ChainDrafts, ChainProposer


class EchoProposer(ChainProposer):
  name, uses_draft_model, fields = "echo_fingerprint", False, ("depth",)

  def check(self, arm):
    pass

  def arm_name(self, arm):
    return f"echo_d{arm.depth}"

  def draft(self, target, drafter, st, s0_B, arm, params, key, rule, live_B):
    tokens_BxK = jnp.repeat(s0_B[:, None], arm.depth, axis=1)
    return ChainDrafts(tokens_BxK, jnp.ones(tokens_BxK.shape, bool), None)
'''


def test_the_fingerprint_follows_the_module_of_a_registered_proposer(tmp_path, monkeypatch):
  """A proposer registered from outside the package is traced too: an edit to its module gives
  new keys, and specs of the built-in proposers alone do not read any module."""
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setattr(proposer, "PROPOSERS", dict(proposer.PROPOSERS))  # registered for this test
  digests = []
  for edit in ("", "\n# an edit to the user's module\n"):
    (tmp_path / "user_proposer.py").write_text(PROPOSER_MODULE + edit)
    sys.modules.pop("user_proposer", None)
    proposer.register(importlib.import_module("user_proposer").EchoProposer())
    spec = SpecConfig(arms=(Strategy("echo_fingerprint", depth=2),))
    digests.append(registered_source_digest(spec))
  assert digests[0] != digests[1]
  builtin = SpecConfig(arms=(Strategy("suffix", depth=3, ngram=2),))
  assert registered_source_digest(builtin) == registered_source_digest(None)


def test_the_cache_holds_a_speculative_slack_in_the_fewest_slots_its_layout_allows():
  """A 128-token prompt bucket and 256 new tokens fill 384 slots; a chain of 3's slack of 5
  adds 16 slots to the xla layout (its steps attend over every slot) and 64 to pallas's (its
  kernel tiles by the largest power of two dividing the cache)."""
  cfg = EngineConfig(prefill_buckets=(64, 128, 256))
  for slack, impl, slots in ((0, "xla", 384), (0, "pallas", 384), (5, "xla", 400),
                             (5, "pallas", 448), (70, "xla", 464), (5, "xla", 390)):
    max_seq_len = 390 if slots == 390 else 2048
    got = cache_length(dataclasses.replace(cfg, cache_slack=slack), max_seq_len, 100, 256, impl)
    assert got == slots, (slack, impl, got)
  # the bucket and 250 new tokens round up to 384 slots, which hold a slack of 5 already
  assert cache_length(dataclasses.replace(cfg, cache_slack=5), 2048, 100, 250, "xla") == 384
