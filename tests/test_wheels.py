"""Wheels for a GPU box without a network: which ones `make wheels` takes, and installing the
missing ones from them with no index."""

import os
import subprocess
import sys
import zipfile

import pytest

from experiments import wheels


def test_the_wheels_are_the_pure_python_closure_without_jax():
  reqs = wheels.project_requirements()
  assert not {"jax", "jaxlib"} & {wheels.dist_name(r) for r in reqs}
  names = {n for n, _ in wheels.pure_closure(reqs)}
  # Direct and indirect pure-Python dependencies are in; compiled ones and the box's jax are not.
  assert {"flax", "optax", "orbax-checkpoint", "ml-collections", "absl-py", "etils"} <= names
  assert not {"jax", "jaxlib", "numpy", "tokenizers", "msgpack", "tensorstore"} & names


def _probe_wheel(folder) -> str:
  """A one-module pure-Python wheel that no index holds."""
  path = os.path.join(folder, "tltprobe-1.0-py3-none-any.whl")
  info = "tltprobe-1.0.dist-info"
  with zipfile.ZipFile(path, "w") as z:
    z.writestr("tltprobe.py", "VALUE = 42\n")
    z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: tltprobe\nVersion: 1.0\n")
    z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
                                "Tag: py3-none-any\n")
    z.writestr(f"{info}/RECORD", f"tltprobe.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n"
                                 f"{info}/RECORD,,\n")
  return path


def test_a_missing_package_is_installed_from_the_wheels_without_an_index(tmp_path):
  """In a fresh virtual environment (a stand-in for the box's Python): `ensure` finds the
  package missing, installs it from the folder with pip's index off, and it imports."""
  _probe_wheel(tmp_path)
  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
  code = ("from experiments import wheels; "
          f"wheels.ensure(['tltprobe'], wheels_dir={str(tmp_path)!r}); "
          "import tltprobe; print(tltprobe.VALUE)")
  proc = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=wheels.ROOT,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.strip().splitlines() == ["[wheels] installing tltprobe from " + str(tmp_path),
                                              "42"]


def test_what_the_wheels_cannot_give_is_one_line(tmp_path):
  with pytest.raises(SystemExit, match=r"needs surely-absent, which this Python lacks: .*"
                                       r"`make wheels`"):
    wheels.ensure(["surely-absent>=1"], wheels_dir=str(tmp_path / "none"), command="bench")
  with pytest.raises(SystemExit, match=r"bench could not install surely-absent from .*"
                                       r"compiled code"):
    wheels.ensure(["surely-absent>=1"], wheels_dir=str(tmp_path), command="bench")
  wheels.ensure(["absl-py>=2"], wheels_dir=str(tmp_path / "none"))  # present: nothing to do
