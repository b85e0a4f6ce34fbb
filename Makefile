# probeselect developer entry points. `make demo` and `make test` work on a fresh machine
# with Python 3.11: they create .venv, install CPU torch and the package, then run.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
# On this project's machines torch==2.13.0 resolves to a local CPU wheel. Elsewhere, pick the
# build explicitly, e.g. TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu (CPU) or
# .../whl/cu128 (CUDA 12.8), and TORCH_SPEC=torch (any version >= 2.2).
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX_URL ?=
DEMO_DIR ?= results/demo
PYTEST_ARGS ?=

.PHONY: install demo test test-slow clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL)) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

demo: install
	$(BIN)/probeselect toy-ladder $(DEMO_DIR)/ladder
	$(BIN)/probeselect score $(DEMO_DIR)/ladder --probes probes/arith_pattern.yaml --out $(DEMO_DIR)/score
	@echo "demo results: $(DEMO_DIR)/score (summary.csv, scores.parquet, items.jsonl, manifest.json)"

test: install
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-slow: install
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache
