# `make demo` and `make test` set everything up themselves on a machine with only Python.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# CPU wheel by default (CI, laptops); GPU users: make setup TORCH_SPEC='torch'
TORCH_SPEC ?= torch==2.13.0
DEMO_SCENARIO ?= showcase

.PHONY: setup browser mpi demo lint test bench clean

$(VENV)/.installed: pyproject.toml setup.py diagnose/importers/_kineto_c.c Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test,cluster]"
	touch $@

setup: $(VENV)/.installed browser mpi

# Headless Chromium for the report and MLflow UI tests (Debian's package; CI runs as root).
browser:
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && apt-get install -y -qq chromium) ; } || \
	  echo "warning: chromium is not installed; the browser tests will fail (apt-get install chromium)"

# Open MPI's mpirun for the launcher tests (Debian's package).
mpi:
	@command -v mpirun >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && apt-get install -y -qq openmpi-bin) ; } || \
	  echo "warning: mpirun is not installed; the mpirun launcher test will fail (apt-get install openmpi-bin)"

demo: setup
	$(VENV)/bin/diagnose demo --scenario $(DEMO_SCENARIO)

# Two pytest-xdist workers, the 2-core box's cores (docs/testing.md, "Time": 511 s vs
# 760 s serially; a third worker gains nothing, the jobs are CPU-bound). Tests that
# read the shared DDP runs are one group, every module's tests another, so each job
# launches once. TEST_ARGS= runs serially.
TEST_ARGS ?= -n 2 --dist loadgroup
# ruff's rules and format in pyproject.toml (docs/testing.md, "Style"); the suite runs after it
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: setup lint
	OMP_NUM_THREADS=1 $(PY) -m pytest -q $(TEST_ARGS) tests

# Issue 8 figures (about 30 min on 2 cores); analyze_vs_hta needs HTA in /tmp/hta-venv (bench/hta_reference.py)
bench: setup
	$(PY) -m bench.overhead
	$(PY) -m bench.scale --ranks 1024 --steps 200
	$(PY) -m bench.analyze_8x100
	$(PY) -m bench.analyze_vs_hta
	$(PY) -m bench.report_size

clean:
	rm -rf $(VENV) runs
