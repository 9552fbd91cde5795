# The two commands of the README: `make demo` and `make test`. Both set up what they need first
# (tools/setup.sh: virtual environment, pinned packages, Debian's Fashion-MNIST); set-up is skipped
# when nothing changed.
VENV ?= $(or $(TFF_SSL_VENV),.venv)
PY := $(VENV)/bin/python
export TFF_SSL_VENV := $(abspath $(VENV))
export TF_CPP_MIN_LOG_LEVEL ?= 3
# Test processes (pytest-xdist); 2 halves the suite's time on 2 cores (TF tracing is single-threaded).
TEST_WORKERS ?= 2

.PHONY: setup demo test

setup:
	@bash tools/setup.sh

demo: setup
	@$(PY) bin/train --task=fmnist_dcco_demo --output_dir=runs/demo-$$(date +%Y%m%d-%H%M%S)

test: setup
	@$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=30
