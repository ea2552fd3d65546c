# Two commands do all set-up on a fresh Debian/Ubuntu machine:
#   make demo   system packages, virtual environment, the package, then `edgefleet demo`
#   make test   the same set-up, then the whole test suite
#   make gpu-check  on an NVIDIA GPU host: every GPU path run and measured in < 8 minutes
# Both are idempotent: a second run only re-installs what changed.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.edgefleet-installed
TEST_STAMP := $(VENV)/.edgefleet-test-installed
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := mosquitto mosquitto-clients ffmpeg gcc g++ python3-dev python3-venv \
                gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user chromium postgresql
# The binaries that show the packages above are present (checked before calling apt).
APT_PROBES := mosquitto mosquitto_pub ffmpeg gcc aarch64-linux-gnu-gcc qemu-aarch64 chromium \
              pg_ctlcluster
# python3-venv and python3-dev ship no binary to probe: ask the interpreter for ensurepip and
# Python.h (Debian's python3 has neither until they are installed).
PY_PROBE := import ensurepip, os, sysconfig; \
            assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
PYTEST_ARGS ?=

.PHONY: demo test lint requirements system-deps install clean gpu-check

demo: install
	$(VENV)/bin/edgefleet demo

test: install $(TEST_STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m tests.support.types
	$(PY) -m pytest --cov --cov-report=term $(PYTEST_ARGS)

# The layer contracts and the types (mypy) of pyproject.toml, checked on the parts under
# their import names.
lint: install
	$(VENV)/bin/ruff check .
	$(PY) -m tests.support.layers
	$(PY) -m tests.support.types

# requirements-edge.txt, requirements-cloud.txt, docker/jetson/requirements-jetson.txt from
# pyproject.toml's extras (the unit tests fail while they are stale).
requirements:
	$(PYTHON) docker/requirements.py

install: system-deps $(STAMP)

system-deps:
	@missing=""; for b in $(APT_PROBES); do command -v $$b >/dev/null 2>&1 || [ -x /usr/sbin/$$b ] || missing="$$missing $$b"; done; \
	$(PYTHON) -c '$(PY_PROBE)' >/dev/null 2>&1 || missing="$$missing python3-venv/python3-dev"; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages (missing:$$missing)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $(APT_PACKAGES); \
	fi

$(STAMP): pyproject.toml setup.py $(wildcard shared/kernels/src/*.c shared/kernels/src/*.h)
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# The default model pack; --no-deps keeps its opencv-python off (we use the headless build).
	$(PY) -m pip install -q --no-deps 'rapidocr-onnxruntime==1.4.4'
	touch $(STAMP)

# The GPU check needs no system packages and no network: on a bare GPU machine it makes the
# venv itself (seeing preinstalled packages such as tensorrt or torch), and its first step
# installs what is missing with bounded pip calls; what cannot be installed becomes the
# skip reason of the steps that need it. Without a GPU it says so, skips every step, exit 0.
GPU_CHECK_ARGS ?=

gpu-check:
	@[ -x $(PY) ] || $(PYTHON) -m venv --system-site-packages $(VENV) \
	  || echo "gpu-check: no venv could be made here; running with $(PYTHON)"
	@py=$(PY); [ -x $$py ] || py=$(PYTHON); \
	  $$py -c 'import edgefleet.bench' 2>/dev/null \
	  || $$py -m pip install -q --no-deps --no-build-isolation -e . \
	  || echo "gpu-check: the package did not install (edgefleet.<part> needs it)"; \
	  $$py -m edgefleet.bench.gpu_check $(GPU_CHECK_ARGS)

# What only the tests need: torch for the PyTorch backend's tests (2.13.0 is a CPU build;
# where pip finds no CPU build on disk it fetches PyPI's, which is larger but works).
$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install -q 'torch==2.13.0'
	touch $(TEST_STAMP)

clean:
	rm -rf $(VENV) build *.egg-info
