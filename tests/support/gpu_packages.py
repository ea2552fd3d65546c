"""GPU packages that install on a CPU host but cannot run on it: onnxruntime-gpu, TensorRT
(its bindings, without the libraries they load) and cuda-python, installed from the package
index into a folder of their own, never into the virtual environment. A process started
with that folder first on its PYTHONPATH meets them as a GPU host with a broken stack would.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGES = [
    "onnxruntime-gpu",
    "tensorrt-cu12",  # the `tensorrt` module: it imports the bindings, which need libnvinfer
    "tensorrt-cu12-bindings",
    "cuda-python",
    "cuda-bindings",
    "cuda-pathfinder",
]


PIP = [sys.executable, "-m", "pip", "install"]


def gpu_packages_dir() -> Path:
    """The folder, installed once per machine (a cache); skips where the index lacks them."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = cache / "edgefleet-tests" / "gpu-packages"
    if (root / ".complete").exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    partial = root.with_name(f"gpu-packages.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    # --no-deps: their dependencies (numpy, protobuf, ...) are the venv's own;
    # --no-build-isolation: tensorrt-cu12 is a source package built offline with setuptools
    result = subprocess.run(
        [*PIP, "--no-deps", "--no-build-isolation", "--target", str(partial), *PACKAGES],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        pytest.skip(f"GPU packages do not install here: {result.stderr.strip()[-300:]}")
    (partial / ".complete").touch()
    try:
        partial.rename(root)
    except OSError:  # another session installed it meanwhile
        shutil.rmtree(partial, ignore_errors=True)
    return root


def env_with(packages: Path) -> dict[str, str]:
    """The environment of a process that imports those packages before the venv's."""
    return {**os.environ, "PYTHONPATH": str(packages), "PYTHONUNBUFFERED": "1"}
