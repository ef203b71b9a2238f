"""The package's layers import one way: each module imports only from layers below its own."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "tlt_jax"

# Bottom to top. A module may import its own package and packages of a lower rank only; packages
# of the same rank are independent of each other.
RANK = {
    "errors": 0, "hashing": 0, "jax_private": 0, "optim": 0, "paths": 0,
    "checkpoint": 0.25,            # orbax checkpoints in a run directory (`paths`)
    "typed": 0.5,                  # config sections to typed settings, raising ConfigError
    "distributed": 0.75,           # the process group (its config section is typed)
    "kernels": 0.9,                # attention implementations (XLA, Pallas)
    "models": 1,                   # incl. the sampling primitives every layer above uses
    "spec": 2, "tasks": 2,         # proposer interface, strategies, verification; task data
    "rollout": 3, "sft": 3,        # the engine knows draft models only through spec.proposer
    "drafter": 4, "evaluation": 4,
    "workloads": 5,
    "rl": 6,
    "sweep": 7,
}


def _imports(path: pathlib.Path):
  """(imported module, line, inside a function) for every import in `path`."""
  tree = ast.parse(path.read_text())
  nested = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      names = ([f"{node.module}.{a.name}" for a in node.names] if node.module == "tlt_jax"
               else [node.module])
    else:
      continue
    for name in names:
      yield name, node.lineno, id(node) in nested


def _layer(module: str) -> str:
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else parts[0]


def test_every_package_has_a_rank():
  packages = {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
              if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
  assert packages == set(RANK)


def test_imports_go_down_the_layers_only():
  upward = []
  for path in sorted(ROOT.rglob("*.py")):
    src = _layer(".".join(path.relative_to(ROOT.parent).with_suffix("").parts))
    for name, line, _ in _imports(path):
      if name.split(".")[0] == "tlt_jax":
        dst = _layer(name)
        if dst != src and RANK[dst] >= RANK[src]:
          upward.append(f"{path.relative_to(ROOT.parent)}:{line} {src} -> {dst}")
  assert not upward, "imports that go up or sideways:\n" + "\n".join(upward)


def test_no_import_is_hidden_in_a_function():
  """Dependencies show at the top of a file; only the test extra's packages (for optional
  comparisons), pyarrow (reading a dataset file), math-verify (the optional `math` extra: it
  brings sympy) and tensorboardX (it imports torch where torch is installed) load on use: 3 s of
  every launcher's start otherwise."""
  optional = {"torch", "transformers", "pyarrow", "math_verify", "tensorboardX"}
  hidden = [f"{path.relative_to(ROOT.parent)}:{line} {name}"
            for path in sorted(ROOT.rglob("*.py")) for name, line, nested in _imports(path)
            if nested and name.split(".")[0] not in optional]
  assert not hidden, "function-level imports:\n" + "\n".join(hidden)


def test_the_library_imports_no_experiment_test_or_torch_code():
  bad = [f"{path.relative_to(ROOT.parent)}:{line} {name}"
         for path in sorted(ROOT.rglob("*.py")) for name, line, _ in _imports(path)
         if name.split(".")[0] in ("experiments", "tests", "torch", "transformers")]
  assert not bad, "\n".join(bad)


# Private names the tests may reach, each for a reason: fsspec's registry of filesystems has no
# public way to add one for the duration of a test, and a filesystem overrides fsspec's `_open`.
PRIVATE_ALLOWED = {"registry._registry", "super()._open"}


def test_no_test_reads_a_private_attribute_of_a_library_object():
  """Tests use the objects' public seams: `x._name` appears in no test file (bar the list above,
  and `self._name` in a test's own classes)."""
  reads = []
  for path in sorted((ROOT.parent / "tests").rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
          and not node.attr.startswith("__")):
        name = f"{ast.unparse(node.value)}.{node.attr}"
        if name not in PRIVATE_ALLOWED and not name.startswith("self."):  # a test's own class
          reads.append(f"{path.name}:{node.lineno} {name}")
  assert not reads, reads
