"""A real Triton Inference Server for the tests: the `tritonserver` 2.51 binary and its
Python backend that the nvidia-pytriton wheel bundles, run on the CPU in a subprocess the
test can kill and start again on the same ports.

The wheel is found without importing pytriton (its Python half is not used). The Python
backend's stub runs the system's libpython of this interpreter's version and finds its
packages (numpy, onnxruntime) through the `python3` first on PATH: this virtual
environment's bin folder goes first there.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from edgefleet.shared.mosquitto import free_port
from tests.support.waiting import eventually


def pytriton_root() -> Path:
    """The installed nvidia-pytriton package folder, or a failure saying how to get it."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise AssertionError(
            "nvidia-pytriton is not installed (its tritonserver is the tests' Triton): "
            "make install-dev installs it"
        )
    return Path(next(iter(spec.submodule_search_locations)))


class TritonServer:
    """`tritonserver --model-repository REPO` with fixed ports, started and killed at will."""

    def __init__(self, repository: Path, workdir: Path) -> None:
        self.repository = repository
        self.workdir = workdir
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.log_path = workdir / "tritonserver.log"
        root = pytriton_root()
        self.binary = root / "tritonserver" / "bin" / "tritonserver"
        self.libs = root.parent / "nvidia_pytriton.libs"
        self.backends = workdir / "backends"
        if not self.backends.exists():  # the backend folder with this Python's stub in it
            shutil.copytree(root / "tritonserver" / "backends", self.backends)
            version = f"{sys.version_info.major}.{sys.version_info.minor}"
            stub = root / "tritonserver" / "python_backend_stubs" / version
            shutil.copy(stub / "triton_python_backend_stub", self.backends / "python")
        self.process: subprocess.Popen | None = None

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def start(self, *, wait_ready: bool = True) -> TritonServer:
        """Start it and wait until it is ready (every model loaded), or only live (it
        answers, whatever its models did: `model_state` says)."""
        env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "LD_LIBRARY_PATH": os.pathsep.join(
                p for p in (os.environ.get("LD_LIBRARY_PATH"), str(self.libs)) if p
            ),
        }
        self.process = subprocess.Popen(
            [str(self.binary), "--model-repository", str(self.repository),
             "--backend-directory", str(self.backends), "--http-port", str(self.http_port),
             "--grpc-port", str(self.grpc_port), "--metrics-port", str(self.metrics_port),
             "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
             "--metrics-address", "127.0.0.1", "--disable-auto-complete-config",
             "--exit-on-error=false", "--log-verbose=0"],
            stdout=self.log_path.open("ab"),
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # killed with its Python stubs, as a group
        )  # fmt: skip
        health = "ready" if wait_ready else "live"
        eventually(lambda: self.health(health), 120, f"tritonserver {health}", detail=self.log_tail)
        return self

    def health(self, which: str = "ready") -> bool:
        assert self.process is not None and self.process.poll() is None, (
            f"tritonserver exited:\n{self.log_tail()}"
        )
        try:
            url = f"http://{self.http_url}/v2/health/{which}"
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def model_state(self, name: str) -> tuple[bool, str]:
        """(ready, the server's reason) of one model, from its repository index."""
        index = httpx.post(f"http://{self.http_url}/v2/repository/index", timeout=5).json()
        for entry in index:
            if entry["name"] == name:
                return entry.get("state") == "READY", entry.get("reason", "")
        return False, "not in the repository index"

    def kill(self) -> None:
        """SIGKILL the server and its stubs: no goodbye to any client."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
