# Everything installs into .venv from this project's own files.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup run demo test lint typecheck pytest bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)  ## set up and run the daemon with the built-in synthetic vLLM fleet
	$(BIN)/coeffd demo $(ARGS)

demo: run

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Two workers (CI's machine has two cores), one test file per worker at a time, so a
# module's shared fixture is built once; `make pytest PYTEST_WORKERS=` runs serially.
PYTEST_WORKERS ?= -n 2 --dist loadfile

pytest: $(STAMP)
	$(BIN)/pytest $(PYTEST_WORKERS)

test: lint typecheck pytest  ## set up, then ruff + mypy + pytest

bench: $(STAMP)
	$(BIN)/python -m bench $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
