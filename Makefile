# ptocube: every target sets itself up (a local .venv with the pinned dependencies).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Test processes: the suite is single-threaded Python, CI has 2 cores. Each test file runs
# in one process (--dist loadfile), so a module's fixtures are built once.
JOBS   ?= 2

export AMARANTH_USE_YOSYS := builtin

.PHONY: all test demo bench regress clean distclean

all: test

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -n $(JOBS) --dist loadfile tests

demo: $(STAMP)
	$(VENV)/bin/ptocube demo

bench: $(STAMP)
	$(PY) -m ptocube.sim.bench

# Verilator, g++ and make are installed with apt-get when running as root; otherwise the
# first step stops and names what to install.
regress: $(STAMP)
	$(PY) -m ptocube.sim.verilator
	$(PY) -m pytest tests -m slow

clean:
	rm -rf build/out .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
