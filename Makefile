# twice's front door. `make demo` and `make test` work on a fresh clone with only
# Python >= 3.11 and make installed: each creates .venv and installs from pyproject.toml.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_DIR ?= logs/demo

.PHONY: setup demo test check bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

## Run the default offline suite (stub models) and write logs, summary.json and report.html.
demo: setup
	$(BIN)/twice run --log-dir $(DEMO_DIR)
	@echo "open $(DEMO_DIR)/report.html in a browser"

## Run the whole test suite.
test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## Lint, format check and type check.
check: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@mkdir -p build/typecheck/twice
	@for p in mocks tasks assertions evals reports; do ln -sfn ../../../$$p build/typecheck/twice/$$p; done
	$(BIN)/mypy

## Benchmarks: prints a table and writes bench/results.json.
bench: setup
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) logs build *.egg-info
