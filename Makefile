# grail: `make demo` runs the whole pipeline on this machine (kfp.local), `make test` the tests.
# Both install into ./.venv first (pip; torch 2.13.0 CPU build; versions from requirements/constraints.txt).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
GRAIL := $(VENV)/bin/grail
STAMP := $(VENV)/.installed
DEMO ?= demo_outputs
PYTEST_ARGS ?=

.PHONY: install demo test lint format bench lock compile clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU wheel of torch 2.13.0 comes from local disk; an unpinned torch would pull a CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -c requirements/constraints.txt -e ".[cpu,dev]"
	touch $(STAMP)

demo: install
	$(GRAIL) run --local

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

format: install
	$(VENV)/bin/ruff format src tests bench
	$(VENV)/bin/ruff check --fix src tests bench

bench: install
	$(PY) bench/clean.py
	$(PY) bench/train.py
	$(PY) bench/benchmark.py

# Re-resolve and freeze the CPU-path versions (run after changing pins in pyproject.toml).
lock:
	rm -rf /tmp/grail-lock && $(PYTHON) -m venv /tmp/grail-lock
	/tmp/grail-lock/bin/pip install --quiet torch==2.13.0 && /tmp/grail-lock/bin/pip install --quiet ".[cpu,dev]"
	( echo "# Pinned versions for the CPU path (Makefile, CI, CPU image): pip install -c requirements/constraints.txt."; \
	  echo "# Regenerate with: make lock"; \
	  /tmp/grail-lock/bin/pip freeze --exclude-editable | grep -v '^grail' | sed 's/^torch==2.13.0+cpu/torch==2.13.0/' ) > requirements/constraints.txt

compile: install
	$(GRAIL) compile

clean:
	rm -rf $(DEMO) local_outputs .pytest_cache .ruff_cache
