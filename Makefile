# Set-up is part of every target: a missing .venv is created and the project installed into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export JAX_PLATFORMS ?= cpu
export PYTHONUNBUFFERED := 1

.PHONY: demo test test-slow install clean-cache

$(VENV)/.base: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.test: $(VENV)/.base
	$(PY) -m pip install -q -e ".[test]"
	touch $@

install: $(VENV)/.base

demo: $(VENV)/.base
	$(PY) -m experiments.demo --config=experiments/configs/demo.py

test: $(VENV)/.test
	$(PY) -m pytest -q -m "not slow"

test-slow: $(VENV)/.test
	$(PY) -m pytest -q -m slow

clean-cache:
	rm -rf .cache
