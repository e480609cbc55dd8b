# The two commands of a fresh clone (README "Set up"). Each first runs scripts/setup.sh, which installs
# only what is missing (torch chosen for this machine, the project with its extras, and for `test`
# Chromium for the browser test) and takes about a second when nothing is.
#   make demo [ARGS="--quick"]            then `lrt-lab demo`
#   make test [ARGS="-k invariants -x"]   then `python -m pytest -q`
#   make lint                             then ruff (lint, format) and the import contracts
# PYTHON=... picks the interpreter; TORCH_SPEC, PIP_EXTRA, SKIP_BROWSER: see scripts/setup.sh.
PYTHON ?= $(shell command -v python3 || command -v python)
ARGS ?=
export PYTHON

.PHONY: demo test lint setup-demo setup-test

setup-demo:
	@bash scripts/setup.sh demo

setup-test:
	@bash scripts/setup.sh test

# `python -m lrt_lab` is the `lrt-lab` entry point, and works where pip's scripts folder is not on PATH.
demo: setup-demo
	$(PYTHON) -m lrt_lab demo $(ARGS)

test: setup-test
	$(PYTHON) -m pytest -q $(ARGS)

# One style and the layering (what CI checks before the tests): ruff's lint and format at 100
# columns, and the import contracts in pyproject.toml (lint-imports). `ruff format .` and
# `ruff check --fix .` repair most of what this reports.
lint: setup-test
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -c "from importlinter.cli import lint_imports_command; lint_imports_command()"
