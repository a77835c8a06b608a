# Developer entry points. Install first: python3 -m venv .venv && .venv/bin/pip install -e '.[dev]'
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: lint format typecheck test test-unit test-integration test-e2e check

lint:            ## ruff: pycodestyle, pyflakes, imports, bugbear, complexity, pyupgrade; and formatting
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format:          ## rewrite the tree in ruff's format and apply ruff's safe fixes
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

typecheck:       ## mypy over engine, relay, consumers, schemas, tests, load_tests (config in pyproject.toml)
	$(BIN)/mypy

test:            ## every tier: unit, integration, e2e (starts its own PostgreSQL and broker), two workers
	$(BIN)/pytest -n 3

test-unit:       ## no I/O, a few seconds
	$(BIN)/pytest tests/unit

test-integration:  ## real PostgreSQL and broker
	$(BIN)/pytest tests/integration

test-e2e:        ## the whole pipeline, the CLI, process faults (-m 'not slow' skips the fault tests)
	$(BIN)/pytest tests/e2e

check: lint typecheck test
