# fusionwatch — every target installs what it needs into .venv first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DEVSTAMP:= $(VENV)/.installed-dev
EXPSTAMP:= $(VENV)/.installed-export
HOST    ?= 127.0.0.1
PORT    ?= 8000
PYTEST_ARGS ?=

.PHONY: install install-dev install-export install-gpu install-cuda run test bench bench-detect bench-load conformance lint fixtures clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The mkl and onednn extras (x86_64 only) give the runtime packed constant-weight GEMMs and direct
# convolutions; a plain `pip install fusionwatch` stays without them and uses numpy's BLAS.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[mkl,onednn]'
	touch $@

$(DEVSTAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev,mkl,onednn]'
	touch $(STAMP) $@

# torch must come from the local CPU wheel (pip finds it on this machine's disk); see tools/make_fixtures.py.
$(EXPSTAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev,export,mkl,onednn]'
	touch $(STAMP) $(DEVSTAMP) $@

install: $(STAMP)
install-dev: $(DEVSTAMP)
install-export: $(EXPSTAMP)

# onnxruntime-gpu and onnxruntime share the import name; swap one for the other.
install-gpu: $(STAMP)
	$(BIN)/pip uninstall -q -y onnxruntime
	$(BIN)/pip install -q -e '.[gpu]'

# CuPy, for our executor on CUDA (providers=["CUDAExecutionProvider", ...]); needs an NVIDIA driver.
install-cuda: $(STAMP)
	$(BIN)/pip install -q -e '.[cuda]'

# The database is FUSIONWATCH_DATABASE_URL (default: SQLite at var/fusionwatch.db); migrations first.
run: $(STAMP)
	$(BIN)/fusionwatch db upgrade
	$(BIN)/fusionwatch serve --host $(HOST) --port $(PORT)

# The dashboard's browser tests (tests/web) drive Debian's Chromium, never a downloaded browser build.
CHROMIUM := /usr/bin/chromium

$(CHROMIUM):
	apt-get install -y chromium || (apt-get update && apt-get install -y chromium) || \
		echo "could not install chromium: the browser tests will skip"

test: $(DEVSTAMP) | $(CHROMIUM)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(EXPSTAMP)
	$(BIN)/python -m bench

# False alarms and recall of the alerts on planted regressions, unpaired and paired, on every noise
# capture in bench/detect_captures.py (each its own row, pooled, the held-out one last); new captures:
# `$(BIN)/python -m bench.detect_measure --out ...` and `$(BIN)/python -m bench.paired_capture --label ...`.
# Then the unpaired path again at ten times the series-commits (48,000 a capture, two seeds, without
# the database; same counts as through the app): at 4,800 one false alarm is 0.21 per 1,000, too coarse
# to tell 0.8 from 1.2. About 10 + 25 minutes on two quiet cores.
bench-detect: $(DEVSTAMP)
	$(BIN)/python -m bench.detect
	$(BIN)/python -m bench.detect_replay --capture --seeds 10 11

# The service under load on loopback (needs Redis, as CI's machine has): req/s, p50/p99, errors.
bench-load: $(DEVSTAMP)
	$(BIN)/python -m bench.load

conformance: $(DEVSTAMP)
	$(BIN)/python -m runtime.conformance

# ruff, then the import contracts in pyproject.toml: service -> runtime -> optimizer, the service's own
# layers (entry points -> commands | queries -> ... -> domain), and no import cycles anywhere.
lint: $(DEVSTAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# tests/models/ (committed), then the zoo in var/zoo/ (generated, kept; models already made are skipped).
fixtures: $(EXPSTAMP)
	$(BIN)/python tools/make_fixtures.py
	$(BIN)/python tools/make_zoo.py

clean:
	rm -rf $(VENV) var/*.db .pytest_cache
