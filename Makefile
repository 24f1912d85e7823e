# kvroute — the two commands: `make demo` (the main job) and `make test` (the tests).
# Both create .venv when it is missing and install the project into it, at the versions in
# constraints.txt (the ones CI tested); `make lock` upgrades that file.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.kvroute-installed
PYTEST := $(PY) -m pytest
LOCK   := constraints.txt

.PHONY: demo test test-fast test-slow test-all bench lint check kernel venv clean lock

venv: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch at the locked version (a CUDA machine may install its own build of it first)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet -c $(LOCK) torch
	$(PY) -m pip install --quiet -c $(LOCK) -e ".[dev,kernel]"
	touch $(STAMP)

# Re-resolve the newest versions pyproject.toml allows in a scratch venv and write them to constraints.txt
# (torch stays at TORCH, its CPU build); then `make test` reinstalls .venv from the new lock.
TORCH ?= 2.13.0
lock:
	set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/python" -m pip install --quiet --upgrade pip; \
	"$$tmp/venv/bin/python" -m pip install --quiet torch==$(TORCH); \
	"$$tmp/venv/bin/python" -m pip install --quiet -e ".[dev,kernel]"; \
	{ sed -n '/^#/p' $(LOCK) 2>/dev/null || true; "$$tmp/venv/bin/python" -m pip freeze --all --exclude-editable \
	  | grep -v '^pip==' | sed -E 's/^(torch==[^+]*)\+.*/\1/'; } > "$$tmp/lock.txt"; \
	mv "$$tmp/lock.txt" $(LOCK); echo "wrote $(LOCK); run make test"

demo: $(STAMP)
	$(VENV)/bin/kvroute demo

test: $(STAMP)
	$(PYTEST) -m "not slow"

# the edit-run loop: unit tests without the statistical ones, on every core (pytest-xdist); `make test` is the gate
test-fast: $(STAMP)
	$(PYTEST) tests/unit -m "not slow and not statistical and not embedded" -n auto -q

test-slow: $(STAMP)
	$(PYTEST) -m slow

test-all: $(STAMP)
	$(PYTEST)

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples

# lint and type check (mypy settings in pyproject.toml); .ci/run runs it before the tests
check: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/mypy src

# the optional kept-entries attention kernel (C++, AVX-512): built ahead of use, never inside a run;
# .ci/run builds it so that its tests run there (docs/performance.md says when it pays)
kernel: $(STAMP)
	$(VENV)/bin/kvroute kernel build

clean:
	rm -rf $(VENV) .pytest_cache build dist src/*.egg-info
