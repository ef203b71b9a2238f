"""What a bare GPU box without a network lacks for `experiments.gpu_proof`, made here (CPU, no
device) into `.cache/gpu_bundle/`: the wheels of the pure-Python dependencies its image does not
carry (`wheels/`), the SmolLM2 GGUF cut into parts that each travel in one device call beside
the tracked tree, and `manifest.json` (`{"files": [{"name", "sha256", "size", "parts"}],
"wheels": [...]}`; parts in order, sha256 of the whole file). On the box, `join` puts each file
back together and checks its digest. docs/GPU.md says how a window carries it.

  make gpu-bundle
  python -m experiments.gpu_bundle [--part_mib=20] [--out=.cache/gpu_bundle]

Standard library only where it runs on the box (`join`): it runs before the dependencies are
there.
"""

import argparse
import hashlib
import json
import os
import shutil
import sys

from experiments import wheels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUNDLE_DIR = os.path.join(ROOT, ".cache", "gpu_bundle")
MANIFEST = "manifest.json"
# A device call carries at most CALL_MIB: the tracked tree (about 42 MiB, the shipped SmolLM2
# drafters 32 of it) and one part.
CALL_MIB, PART_MIB = 64, 20
# Distributions the device's CUDA image already holds (its package list, read 2026-11-17): the
# bundle carries the wheels of the project's pure-Python closure less these.
BOX_IMAGE = frozenset("""
absl-py aiofiles anyio certifi click cycler etils filelock flax fsspec h11 httpcore httpx
huggingface-hub humanize idna jinja2 markdown-it-py markupsafe mdurl optax orbax-checkpoint
packaging prometheus-client pygments pyparsing python-dateutil requests rich tqdm treescope
typing-extensions urllib3 tzdata
""".split())


def sha256(path: str) -> str:
  """The file's sha256, read in 16 MiB blocks."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 24), b""):
      h.update(block)
  return h.hexdigest()


def split_file(path: str, out_dir: str, part_bytes: int) -> dict:
  """Cuts `path` into parts of at most `part_bytes` named `<name>.part<i>` in `out_dir`; returns
  its manifest entry."""
  name, size = os.path.basename(path), os.path.getsize(path)
  parts = []
  with open(path, "rb") as f:
    for i in range(max(1, -(-size // part_bytes))):
      parts.append(f"{name}.part{i}")
      with open(os.path.join(out_dir, parts[-1]), "wb") as out:
        out.write(f.read(part_bytes))
  return {"name": name, "sha256": sha256(path), "size": size, "parts": parts}


def join(bundle_dir: str = BUNDLE_DIR) -> dict[str, str]:
  """Each file of the bundle's manifest whole again in `bundle_dir` (kept where it already is and
  its digest matches); returns {name: path}. Exits with one line naming a missing part or a
  digest that does not match."""
  path = os.path.join(bundle_dir, MANIFEST)
  if not os.path.exists(path):
    sys.exit(f"No GPU bundle in {bundle_dir} ({MANIFEST} is missing): run `make gpu-bundle` and "
             "carry .cache/gpu_bundle as docs/GPU.md says.")
  with open(path) as f:
    manifest = json.load(f)
  out = {}
  for entry in manifest["files"]:
    whole = os.path.join(bundle_dir, entry["name"])
    if not (os.path.exists(whole) and os.path.getsize(whole) == entry["size"]
            and sha256(whole) == entry["sha256"]):
      missing = [p for p in entry["parts"] if not os.path.exists(os.path.join(bundle_dir, p))]
      if missing:
        sys.exit(f"The GPU bundle lacks {', '.join(missing)} of {entry['name']}: carry every "
                 "part (docs/GPU.md).")
      with open(whole + ".tmp", "wb") as f:
        for part in entry["parts"]:
          with open(os.path.join(bundle_dir, part), "rb") as src:
            shutil.copyfileobj(src, f, 1 << 24)
      if sha256(whole + ".tmp") != entry["sha256"]:
        sys.exit(f"{entry['name']} joined from its parts has another sha256 than the manifest's: "
                 "a part was cut short in transit; carry it again.")
      os.replace(whole + ".tmp", whole)
    out[entry["name"]] = whole
  return out


def box_wheels(dest: str) -> list[str]:
  """Downloads the wheels of the project's pure-Python closure that the box's image lacks, at
  the versions installed here, into `dest`; returns their file names."""
  os.makedirs(dest, exist_ok=True)
  pins = [f"{n}=={v}" for n, v in wheels.pure_closure(wheels.project_requirements())
          if n not in BOX_IMAGE]
  wheels.fetch(pins, dest)
  return sorted(os.listdir(dest))


def make_bundle(out_dir: str = BUNDLE_DIR, part_mib: int = PART_MIB, with_wheels: bool = True,
                files: list[str] | None = None) -> dict:
  """Writes the bundle (the SmolLM2 GGUF unless `files` names others) into `out_dir`, replacing
  an older one; returns its manifest."""
  if files is None:
    from tlt_jax.models.pretrained import smollm2_gguf_path
    files = [smollm2_gguf_path()]
  shutil.rmtree(out_dir, ignore_errors=True)
  os.makedirs(out_dir)
  manifest = {"files": [split_file(f, out_dir, part_mib << 20) for f in files], "wheels": []}
  if with_wheels:
    manifest["wheels"] = box_wheels(os.path.join(out_dir, "wheels"))
  with open(os.path.join(out_dir, MANIFEST), "w") as f:
    json.dump(manifest, f, indent=1)
  return manifest


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", default=BUNDLE_DIR)
  p.add_argument("--part_mib", type=int, default=PART_MIB)
  args = p.parse_args()
  manifest = make_bundle(args.out, args.part_mib)
  for entry in manifest["files"]:
    print(f"[gpu_bundle] {entry['name']}: {entry['size'] / 2**20:.1f} MiB in "
          f"{len(entry['parts'])} parts of <= {args.part_mib} MiB")
  print(f"[gpu_bundle] {len(manifest['wheels'])} wheels: {', '.join(manifest['wheels'])}")
  print(json.dumps({"bundle": args.out, **manifest}))


if __name__ == "__main__":
  main()
