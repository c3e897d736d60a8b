# Everything installs into .venv from this project's own files: `make run` only the runtime
# dependencies (316 MB in a fresh venv, uv's 37 MB included), the targets that lint,
# type-check, test or benchmark also the dev extras (pytest, Helm SDK, Kubernetes schemas,
# ruff, mypy: 787 MB in all).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
RUNTIME := $(VENV)/.installed-runtime
DEV     := $(VENV)/.installed-dev

.PHONY: setup run demo test lint typecheck pytest bench clean

# uv (from PyPI, into the venv) resolves, downloads and installs several times faster than
# pip: a fresh venv with the dev extras took 37-49 s (empty uv cache) against pip's 156 s
# (one run) and 193 s (runtime, then dev: two runs), on this machine at load ~8. It does
# not read pip's configuration files, so where it cannot install (an index only pip.conf
# names, no wheel of uv for the platform) pip does, as before. No bytecode at install
# (pip compiles all of site-packages; `--compile-bytecode` cost uv 17 s more): Python
# writes it for the modules a process imports, once.
define install
	if $(BIN)/python -m pip install --quiet uv && \
	   $(BIN)/uv pip install --quiet --python $(BIN)/python $(1); then :; else \
	  echo "uv could not install; installing with pip" >&2; \
	  $(BIN)/python -m pip install --quiet --upgrade pip && \
	  $(BIN)/python -m pip install --quiet $(1); \
	fi
endef

# The install builds the compiled OTLP decoder and RLS fold too: reinstall when their
# sources change.
$(RUNTIME): pyproject.toml setup.py coeffd/receivers/otlp/_wire.c coeffd/learners/_fold.c
	$(PYTHON) -m venv $(VENV)
	$(call install,-e .)
	touch $(RUNTIME)

# One install of the dev extras on a fresh venv (not runtime first, then dev: that was two
# resolutions); `make run` afterwards finds the runtime installed with them.
$(DEV): pyproject.toml setup.py coeffd/receivers/otlp/_wire.c coeffd/learners/_fold.c
	$(PYTHON) -m venv $(VENV)
	$(call install,-e '.[dev]')
	touch $(RUNTIME) $(DEV)

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
# --no-loadscope-reorder: files are handed out in collection order, the long (slow-marked)
# ones first (tests/conftest.py). xdist's default reorders files by their number of tests,
# most first, which put the long files of few tests last: in a suite run of 1,762 s of
# test time over two workers, test_crash_restart (1 test) started after 1,703 s of it,
# test_registry_batch (2 tests, 57 s) after 1,672, test_closedloop (4) after 1,135.
PYTEST_WORKERS ?= -n 2 --dist loadfile --no-loadscope-reorder

# Bytecode on even where the environment turns it off (PYTHONDONTWRITEBYTECODE): the ~35
# daemons the suite starts then import coeffd from .pyc (1.36 -> 1.10 s CPU each) and a
# second run collects with pytest's rewritten asserts cached (11.5 -> 6.4 s CPU per worker).
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest $(PYTEST_WORKERS)

pytest: $(DEV)
	$(PYTEST)

# mypy beside pytest, not before it: on a fresh clone (no cache) it is ~60 s of one core
# (111 s wall at load ~6), while pytest's workers also wait on the daemons they start.
# Its report comes after pytest's; either failing fails the target.
test: lint  ## set up, then ruff, then mypy and pytest side by side
	$(BIN)/mypy > $(VENV)/mypy.out 2>&1 & types=$$!; \
	$(PYTEST); tests=$$?; \
	wait $$types; typed=$$?; cat $(VENV)/mypy.out; \
	test $$tests -eq 0 && test $$typed -eq 0

bench: $(DEV)
	$(BIN)/python -m bench $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
