"""A real Triton Inference Server for the tests, the bench and the GPU check: the
`tritonserver` 2.51 binary and its Python backend that the nvidia-pytriton wheel bundles
(CPU only: no onnxruntime or TensorRT backend), run in a subprocess that can be killed and
started again on the same ports.

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
import time
from pathlib import Path

import httpx

from edgefleet.bench.mosquitto import free_port
from edgefleet.shared.errors import ConfigError


def pytriton_root() -> Path:
    """The installed nvidia-pytriton package folder, or an error saying how to get it."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "nvidia-pytriton is not installed (its tritonserver is the one run here)",
            hint="pip install --no-deps nvidia-pytriton (make install-dev does)",
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

    def start(self, *, wait_ready: bool = True, timeout_s: float = 120) -> TritonServer:
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
        deadline = time.monotonic() + timeout_s
        while not self.health(health):
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"tritonserver not {health} in {timeout_s} s:\n{self.log_tail()}"
                )
            time.sleep(0.05)
        return self

    def health(self, which: str = "ready") -> bool:
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"tritonserver exited:\n{self.log_tail()}")
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

    def cpu_seconds(self) -> float:
        """CPU time of the server and its Python stubs so far."""
        import psutil

        if self.process is None or self.process.poll() is not None:
            return 0.0
        root = psutil.Process(self.process.pid)
        total = 0.0
        for proc in [root, *root.children(recursive=True)]:
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

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
