# kvroute — the two commands: `make demo` (the main job) and `make test` (the tests).
# Both create .venv when it is missing and install the project into it.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.kvroute-installed
PYTEST := $(PY) -m pytest

.PHONY: demo test test-slow test-all bench lint venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# the CPU build of torch (a CUDA machine may install its own build first)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/kvroute demo

test: $(STAMP)
	$(PYTEST) -m "not slow"

test-slow: $(STAMP)
	$(PYTEST) -m slow

test-all: $(STAMP)
	$(PYTEST)

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache build dist src/*.egg-info
