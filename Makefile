# The two commands of README.md. Everything lives in .venv; torch is pinned to the CPU build
# on this machine's disk first, so nothing pulls a multi-GB CUDA wheel.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[train,aim,test,bench]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(PY) -m trainer --demo --output_dir demo-output

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) demo-output
