"""On a CPU host with GPU packages installed that cannot load (onnxruntime-gpu without CUDA,
TensorRT's bindings without libnvinfer, cuda-python without a driver), the cloud and the
agent start on the next backend in the order and say why: in /readyz, the agent's health,
the log and the fallback counter. Both run as real processes on the real packages."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from edgefleet.bench.mosquitto import free_port
from edgefleet.shared.executor.backends import gpu_reason
from tests.support.edge import write_video
from tests.support.gpu_packages import env_with, gpu_packages_dir
from tests.support.waiting import eventually

BIN = Path(sys.executable).parent / "edgefleet"
GPU_BACKENDS = ["tensorrt", "onnxruntime-tensorrt", "onnxruntime-cuda"]


@pytest.fixture(scope="module")
def gpu_packages() -> Path:
    if gpu_reason() is None:
        pytest.skip("a GPU is visible here: these packages may well load on it")
    return gpu_packages_dir()


def _answer(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=10)
    except httpx.TransportError:
        return None


def _ready(url: str, process: subprocess.Popen, log: Path) -> dict:
    answers: list[httpx.Response] = []

    def answered() -> bool:
        assert process.poll() is None, f"it exited {process.returncode}: {log.read_text()[-3000:]}"
        response = _answer(url)
        answers[:] = [response] if response is not None else []
        return response is not None and response.status_code == 200

    eventually(answered, 180, f"{url} to answer 200", detail=lambda: log.read_text()[-3000:])
    return answers[0].json()


def _stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()


def _assert_on_cpu_saying_why(execution: dict) -> None:
    assert execution["models"], execution
    for component, choice in execution["models"].items():
        assert choice["backend"] == "onnxruntime-cpu", (component, choice)
        assert choice["provider"] == "CPUExecutionProvider"
        skipped = {s["backend"]: s["reason"] for s in choice["skipped"]}
        assert list(skipped) == GPU_BACKENDS, skipped
        # each says what really failed: the library TensorRT's bindings could not load,
        # the provider ONNX Runtime could not start
        assert "failed its proof: ImportError: libnv" in skipped["tensorrt"]
        assert "did not start TensorrtExecutionProvider" in skipped["onnxruntime-tensorrt"]
        assert "did not start CUDAExecutionProvider" in skipped["onnxruntime-cuda"]
    proofs = execution["proofs"]
    assert proofs["onnxruntime-cpu"] is None
    assert all(proofs[name] for name in GPU_BACKENDS), proofs
    # the self-test the process ran at its start said the same before any model loaded
    selftest = execution["selftest"]
    assert (selftest["backend"], selftest["provider"]) == (
        "onnxruntime-cpu",
        "CPUExecutionProvider",
    )
    assert [s["backend"] for s in selftest["skipped"]] == GPU_BACKENDS


def test_the_cloud_starts_on_the_cpu_and_readyz_says_why(gpu_packages: Path, tmp_path: Path):
    # given a cloud whose onnxruntime is the GPU build, with TensorRT and cuda-python beside
    port = free_port()
    config = tmp_path / "cloud.yaml"
    config.write_text(
        json.dumps(
            {
                "http": {"port": port},
                "ingest": {"enabled": False},
                "data_dir": str(tmp_path / "data"),
                "models": {"served": ["ppocr"], "lighter": "ppocr"},
            }
        )
    )
    log = tmp_path / "serve.log"
    process = subprocess.Popen(
        [str(BIN), "cloud", "serve", "-c", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env=env_with(gpu_packages),
    )
    try:
        # when it starts, then it is ready on the CPU backend and names each one it skipped
        body = _ready(f"http://127.0.0.1:{port}/readyz", process, log)
        assert body["models"][0]["backend"] == "onnxruntime-cpu" and body["models"][0]["warmed"]
        _assert_on_cpu_saying_why(body["execution"])
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        for name in GPU_BACKENDS:
            assert f'ef_backend_fallbacks_total{{backend="{name}",reason="proof"}}' in metrics
        text = log.read_text()
        # one warning per backend and reason, not one per model file
        assert text.count("backend tensorrt passed over") == 1, text[-3000:]
        assert "selftest: backend onnxruntime-cpu (provider CPUExecutionProvider)" in text
    finally:
        _stop(process)


def test_the_agent_starts_on_the_cpu_and_its_health_says_why(gpu_packages: Path, tmp_path: Path):
    # given an agent with the same packages, its broker not yet up (it starts regardless)
    health_port = free_port()
    video = write_video(tmp_path / "clip.mp4", ["LOT 1", "LOT 2"])
    config = tmp_path / "edge.yaml"
    config.write_text(
        json.dumps(
            {
                "device_id": "cam-01",
                "device_key": "k",
                "mqtt": {"host": "127.0.0.1", "port": free_port()},
                "streams": [{"id": "clip", "url": str(video), "loop": True}],
                "outbox": {"path": str(tmp_path / "outbox.db")},
                "health": {"port": health_port},
                "state_dir": str(tmp_path / "state"),
            }
        )
    )
    log = tmp_path / "agent.log"
    process = subprocess.Popen(
        [str(BIN), "edge", "run", "-c", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env=env_with(gpu_packages),
    )
    try:
        # when it runs, then its health names the CPU backend and why each GPU one was skipped
        body = _ready(f"http://127.0.0.1:{health_port}/healthz", process, log)
        assert body["status"] == "ok" and body["device_id"] == "cam-01"
        _assert_on_cpu_saying_why(body["execution"])
        assert "selftest: backend onnxruntime-cpu (provider CPUExecutionProvider)" in (
            log.read_text()
        )
        assert process.poll() is None, log.read_text()[-3000:]
    finally:
        _stop(process)
