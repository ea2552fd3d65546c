# Two commands do all set-up on a fresh Debian/Ubuntu machine:
#   make demo   what the demo needs (Mosquitto, a C compiler for the kernels, .venv, the
#               package and its model pack), then `edgefleet demo`
#   make test   the demo's set-up plus the test tools (Mosquitto clients, ffmpeg, the aarch64
#               cross compiler and qemu, Chromium, the dev extras), then the whole suite
#   make gpu-check  on an NVIDIA GPU host: every GPU path run and measured in < 8 minutes
# All are idempotent: a second run probes, finds everything and installs nothing.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.edgefleet-installed
DEV_STAMP := $(VENV)/.edgefleet-dev-installed
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The demo: the broker, and what `pip install -e .` needs to build the C kernels. The demo
# renders its videos with OpenCV's own codecs (the wheel bundles them): no ffmpeg.
DEMO_APT_PACKAGES := mosquitto gcc libc6-dev python3-dev python3-venv
DEMO_APT_PROBES   := mosquitto gcc
# The tests: mosquitto_pub, ffmpeg (a live UDP stream), the NEON kernels under qemu,
# the dashboard in a headless browser.
TEST_APT_PACKAGES := mosquitto-clients ffmpeg g++ gcc-aarch64-linux-gnu libc6-dev-arm64-cross \
                     qemu-user chromium
TEST_APT_PROBES   := mosquitto_pub ffmpeg g++ aarch64-linux-gnu-gcc qemu-aarch64 chromium
# python3-venv and python3-dev ship no binary to probe: ask the interpreter for ensurepip and
# Python.h (Debian's python3 has neither until they are installed).
PY_PROBE := import ensurepip, os, sysconfig; \
            assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
PYTEST_ARGS ?=
DEMO_ARGS ?=

# $(call apt_install,PROBES,PACKAGES,EXTRA_CHECK): apt-get only when a probe is missing.
define apt_install
	@missing=""; for b in $(1); do command -v $$b >/dev/null 2>&1 || [ -x /usr/sbin/$$b ] || missing="$$missing $$b"; done; \
	$(3) \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages (missing:$$missing)"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $(2); \
	fi
endef

.PHONY: demo test lint system-deps test-system-deps install install-dev clean gpu-check

demo: install
	$(VENV)/bin/edgefleet demo $(DEMO_ARGS)

test: install-dev
	$(VENV)/bin/ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

install: system-deps $(STAMP)

install-dev: install test-system-deps $(DEV_STAMP)

system-deps:
	$(call apt_install,$(DEMO_APT_PROBES),$(DEMO_APT_PACKAGES),$(PYTHON) -c '$(PY_PROBE)' >/dev/null 2>&1 || missing="$$missing python3-venv/python3-dev";)

test-system-deps:
	$(call apt_install,$(TEST_APT_PROBES),$(TEST_APT_PACKAGES),)

$(STAMP): pyproject.toml setup.py $(wildcard shared/kernels/src/*.c shared/kernels/src/*.h)
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	# The default model pack; --no-deps keeps its opencv-python off (we use the headless build).
	$(PY) -m pip install -q --no-deps 'rapidocr-onnxruntime==1.4.4'
	touch $(STAMP)

# The test tools on top of the demo's set-up (pytest, ruff, playwright, ...).
$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(DEV_STAMP)

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
