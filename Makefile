# Two entry points that work on a fresh machine with only Python 3.11 and pip:
#   make demo   simulated node (fake FPGA sysfs tree + emulated kubelets), no hardware, no cluster
#   make test   lint + the whole test suite, including the kubelet compatibility matrix
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml build_support/backend.py $(wildcard protos/*/api.proto)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

# The demo's code (compat_tests/) is in no installed package: `python -m` from the checkout's
# root finds it there, as pytest and `make bench` do.
demo: $(STAMP)
	$(BIN)/python -m plugin demo $(if $(DEMO),--node $(DEMO))

lint: $(STAMP)
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) api_versions/_generated build *.egg-info
