# `make demo` and `make test` do their own set-up on a fresh machine, and skip it when nothing changed.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rollplan-installed
SETUP_INPUTS := Makefile requirements-dev.txt packages/models/pyproject.toml packages/solver/pyproject.toml packages/sim/pyproject.toml packages/executor/pyproject.toml

.PHONY: setup demo test test-fast lint bench-planner calibrate clean

setup: $(STAMP)

$(STAMP): $(SETUP_INPUTS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e packages/models -e packages/solver -e packages/sim -e 'packages/executor[cpu,trl]' -r requirements-dev.txt
	@# The CPU vLLM build pulls CUDA-built torchvision/torchaudio/torchcodec and triton: they break
	@# `import transformers` and are unused on CPU (see ../shared/notes/REAL_ENGINES_ON_CPU.md).
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec triton || true
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/rollplan demo

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not ray and not vllm"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pyright

bench-planner: $(STAMP)
	$(VENV)/bin/rollplan bench planner --json

calibrate: $(STAMP)
	$(VENV)/bin/rollplan perf fit --data ../shared/data --gpu h100 --out packages/models/src/rollplan/models/data/calibrated_h100.json --json
	$(VENV)/bin/rollplan perf fit --data ../shared/data --gpu h200 --out packages/models/src/rollplan/models/data/calibrated_h200.json --json

clean:
	rm -rf $(VENV)
