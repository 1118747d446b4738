# VT: the two commands a new user runs, plus lint.
#   make test        create .venv, install, run the default test suite
#   make quickstart  create .venv, install, SFT + GRPO a tiny policy on CPU (minutes)
# Both are idempotent: the install step re-runs only when the package
# metadata changes.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: test test-all quickstart lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# Installs the package (editable) with its train and dev extras, torch pinned
# to the CPU build; the stamp records which metadata it was installed from.
$(VENV)/.installed-dev: $(BIN)/python pyproject.toml setup.cfg constraints/cpu.txt
	$(PIP) install --quiet -c constraints/cpu.txt -e ".[train,dev]"
	@touch $@

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q

test-all: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -m ""

quickstart: $(VENV)/.installed-dev
	$(BIN)/python -m vt_train.quickstart --out runs/quickstart

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check vt_envs vt_train vt_bench tests scripts
	$(BIN)/ruff format --check vt_envs vt_train vt_bench tests scripts

bench: $(VENV)/.installed-dev
	$(BIN)/python -m vt_bench all

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
