# Everything installs into .venv from this project's own files: `make run` only the runtime
# dependencies (332 MB, measured with `pip install .` in a fresh venv), the targets that
# lint, type-check, test or benchmark also the dev extras (pytest, Helm SDK, Kubernetes
# schemas, ruff, mypy: 823 MB in all).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
RUNTIME := $(VENV)/.installed-runtime
DEV     := $(VENV)/.installed-dev

.PHONY: setup run demo test lint typecheck pytest bench clean

# The install builds the compiled OTLP decoder too: reinstall when its source changes.
$(RUNTIME): pyproject.toml setup.py coeffd/receivers/otlp/_wire.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUNTIME)

$(DEV): $(RUNTIME)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(DEV)

setup: $(DEV)

run: $(RUNTIME)  ## set up (runtime dependencies only) and run the daemon with the built-in synthetic vLLM fleet
	$(BIN)/coeffd demo $(ARGS)

demo: run

lint: $(DEV)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(DEV)
	$(BIN)/mypy

# Two workers (CI's machine has two cores), one test file per worker at a time, so a
# module's shared fixture is built once; `make pytest PYTEST_WORKERS=` runs serially.
PYTEST_WORKERS ?= -n 2 --dist loadfile

# Bytecode on even where the environment turns it off (PYTHONDONTWRITEBYTECODE): the ~35
# daemons the suite starts then import coeffd from .pyc (1.36 -> 1.10 s CPU each) and a
# second run collects with pytest's rewritten asserts cached (11.5 -> 6.4 s CPU per worker).
pytest: $(DEV)
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest $(PYTEST_WORKERS)

test: lint typecheck pytest  ## set up, then ruff + mypy + pytest

bench: $(DEV)
	$(BIN)/python -m bench $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
