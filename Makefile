# Two entry points that work on a fresh machine with only Python 3.11 and pip:
#   make demo   simulated node (fake FPGA sysfs tree + emulated kubelets), no hardware, no cluster
#   make test   lint + the whole test suite, including the kubelet compatibility matrix; first
#               installs the system tools the tests run where missing (.ci/install-test-tools,
#               root and apt-get); `make test TOOLS=no` skips that step
PYTHON ?= python3
VENV ?= .venv
TOOLS ?= yes
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test tools lint bench clean

$(STAMP): pyproject.toml build_support/backend.py $(wildcard protos/*/api.proto)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

# The demo's code (compat_tests/) is in no installed package, and the installed CLI has no
# demo command: `python -m` from the checkout's root finds it there, as pytest and `make bench` do.
demo: $(STAMP)
	$(BIN)/python -m compat_tests.demo $(if $(DEMO),--node $(DEMO))

lint: $(STAMP)
	$(BIN)/ruff check .

# A failed install does not stop the run: the tests needing the missing tool skip and say
# which it is (under CI=true they fail).
tools:
ifneq ($(TOOLS),no)
	bash .ci/install-test-tools || echo "test tools: going on without them"
endif

test: tools lint
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) api_versions/_generated build *.egg-info
