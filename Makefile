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
# Pinned versions of the packages that decide the toy ladder's numbers (see constraints.txt);
# `make install CONSTRAINTS=` installs without them.
CONSTRAINTS ?= constraints.txt
DEMO_DIR ?= results/demo
DEMO_LATE_DIR ?= results/demo-late
PYTEST_ARGS ?=

.PHONY: install demo demo-late example test test-slow clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL)) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e ".[test]"
	touch $@

PROBES := probes/arith_pattern.yaml probes/tmpl_repeated.yaml probes/tmpl_mismatch.yaml \
	probes/tmpl_flipped.yaml probes/demo/persona_qa.yaml probes/capability/arith_plain.yaml \
	probes/capability/relation_plain.yaml probes/capability/persona_plain.yaml

# The whole pipeline (recipes/demo.yaml): toy ladder -> score -> average -> dynamics -> shortlist -> plan lock
# -> pilot SFT + transfer -> select -> confirm -> report; resumable (stages with unchanged inputs
# are skipped). Writes only under $(DEMO_DIR)/ (git-ignored): a demo leaves `git status` clean.
demo: install
	$(BIN)/probeselect run recipes/demo.yaml out=$(DEMO_DIR)
	@echo "demo results: $(DEMO_DIR)/ (ladder/, score/ with report.html)"

# The second demo (issue 23): the same pipeline on the LATE-HARM toy ladder
# (recipes/demo-late.yaml: curriculum recipes/ladder-late-harm.yaml, plan
# recipes/selection-late-harm.yaml), built for the case where the latest checkpoint transfers worse while
# its held-out loss is the best (what it shows, and what it does not: docs/validation.md).
# Writes only under $(DEMO_LATE_DIR)/ (git-ignored); resumable like `demo`.
demo-late: install
	$(BIN)/probeselect run recipes/demo-late.yaml out=$(DEMO_LATE_DIR)
	@echo "late-harm demo results: $(DEMO_LATE_DIR)/ (ladder/, score/ with report.html)"

# Refresh the committed example copy in results/example/ from the demo's outputs (runs the demo
# first; a finished demo is skipped stage by stage). The only target that writes tracked files.
EXAMPLE_FILES := report.md report.html report_figures summary.csv shortlist.csv shortlist.json plan.lock.json selection.csv \
	selection.json confirm.json manifest.json dynamics
example: demo
	rm -rf results/example && mkdir -p results/example/pilot results/example/confirm
	cd $(DEMO_DIR)/score && cp -r $(EXAMPLE_FILES) $(CURDIR)/results/example/
	cd $(DEMO_DIR)/score && cp pilot/transfer.csv pilot/transfer_base.csv pilot/diagnostics.csv pilot/manifest.json $(CURDIR)/results/example/pilot/
	cd $(DEMO_DIR)/score && cp confirm/transfer.csv confirm/diagnostics.csv $(CURDIR)/results/example/confirm/
	@echo "example copy refreshed in results/example/ from $(DEMO_DIR)/score"

test: install
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The slow headline tests (full-size toy ladders of seeds 0-2: >= 90% held-out arithmetic and the
# planted dip with recovery); .ci/run runs them after `make test`. One build per seed is shared by
# the tests of that seed: about 3 x (3.5 min build + 2 min scoring) on 2 CPU cores.
test-slow: install
	$(BIN)/python -m pytest -q -m slow --durations=0 $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(DEMO_DIR) $(DEMO_LATE_DIR) .pytest_cache
