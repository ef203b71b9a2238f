"""The project's pure-Python dependencies as wheels, for a GPU box without a network.

A CUDA container brings its own jax; what it lacks of the rest (ml-collections, flax, optax, ...)
cannot come from a registry there. On a machine with a network, `make wheels` (this module)
downloads the wheels of every pure-Python package the project needs, as installed in `.venv`,
into `wheels/`; copy the checkout with that folder to the box, and `python -m
experiments.bench_gpu` installs from it whatever the box lacks (`ensure`), before importing
anything else. Standard library only: it runs before the dependencies are there.

  python -m experiments.wheels            # into wheels/
"""

import importlib.metadata as metadata
import os
import re
import subprocess
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEELS_DIR = os.path.join(ROOT, "wheels")
# The box's own builds: never replaced from wheels made elsewhere.
ACCELERATOR_OWN = ("jax", "jaxlib")


def dist_name(requirement: str) -> str:
  """A requirement's distribution name, normalised ("orbax-checkpoint>=0.11" ->
  "orbax-checkpoint")."""
  return re.sub(r"[-_.]+", "-", re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)[1]
                ).lower()


def project_requirements() -> list[str]:
  """`[project] dependencies` of pyproject.toml, less the box's own jax."""
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
  return [r for r in deps if dist_name(r) not in ACCELERATOR_OWN]


def missing(requirements: list[str]) -> list[str]:
  """The requirements whose distribution is not installed (versions are not compared)."""
  out = []
  for r in requirements:
    try:
      metadata.distribution(dist_name(r))
    except metadata.PackageNotFoundError:
      out.append(r)
  return out


def ensure(requirements: list[str] | None = None, wheels_dir: str = WHEELS_DIR,
           command: str = "this command") -> None:
  """Installs the missing `requirements` (default: the project's) from `wheels_dir`, with no
  index; exits with one line saying what is missing and how to get it where that fails."""
  needed = missing(project_requirements() if requirements is None else requirements)
  if not needed:
    return
  names = ", ".join(dist_name(r) for r in needed)
  if not os.path.isdir(wheels_dir):
    sys.exit(f"{command} needs {names}, which this Python lacks: install them, or run "
             f"`make wheels` on a machine with a network and copy its wheels/ to {wheels_dir}.")
  print(f"[wheels] installing {names} from {wheels_dir}", flush=True)
  proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                         "--find-links", wheels_dir, *needed], capture_output=True, text=True)
  if proc.returncode != 0:
    reason = (proc.stderr.strip().splitlines() or ["pip failed"])[-1]
    sys.exit(f"{command} could not install {names} from {wheels_dir} ({reason}); packages with "
             "compiled code must be installed for this Python by other means.")


def pure_closure(requirements: list[str]) -> list[tuple[str, str]]:
  """(name, version) of every installed pure-Python distribution that `requirements` need,
  directly or through others (extras and environment markers aside), jax's own excluded."""
  seen, stack, pure = set(), [dist_name(r) for r in requirements], []
  while stack:
    name = stack.pop()
    if name in seen or name in ACCELERATOR_OWN:
      continue
    seen.add(name)
    try:
      dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
      continue  # only needed under a marker that does not hold here
    stack += [dist_name(r) for r in dist.requires or () if "extra ==" not in r]
    if "Root-Is-Purelib: true" in (dist.read_text("WHEEL") or ""):
      pure.append((name, dist.version))
  return sorted(pure)


def fetch(pins: list[str], dest: str) -> None:
  """Downloads the wheels of `pins` ("name==version"), without their dependencies, into
  `dest`."""
  os.makedirs(dest, exist_ok=True)
  subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                  "--only-binary=:all:", "-d", dest, *pins], check=True)


def download(dest: str = WHEELS_DIR) -> list[str]:
  """Downloads the wheels of `pure_closure(project_requirements())`, at the installed versions,
  into `dest`; returns the files there."""
  fetch([f"{n}=={v}" for n, v in pure_closure(project_requirements())], dest)
  return sorted(os.listdir(dest))


if __name__ == "__main__":
  files = download(sys.argv[1] if len(sys.argv) > 1 else WHEELS_DIR)
  print(f"[wheels] {len(files)} wheels in {sys.argv[1] if len(sys.argv) > 1 else WHEELS_DIR}")
