"""The executable pool's key covers the code a rollout program traces and nothing else: an edit to
a traced layer gives new keys (no stale program is ever loaded), an edit to the trainer keeps the
cached programs."""

import pathlib
import shutil

from tlt_jax.rollout.programs import TRACED_PACKAGES, traced_source_digest

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
