# `make demo` and `make test` set everything up themselves on a machine with only Python.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# CPU wheel by default (CI, laptops); GPU users: make setup TORCH_SPEC='torch'
TORCH_SPEC ?= torch==2.13.0
DEMO_SCENARIO ?= straggler

.PHONY: setup demo test bench clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/diagnose demo --scenario $(DEMO_SCENARIO)

test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q tests

bench: setup
	$(PY) bench/overhead.py

clean:
	rm -rf $(VENV) runs
