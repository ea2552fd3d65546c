"""The start-up self-test, as a container runs it: the real `edgefleet edge|cloud selftest`
commands in their own processes, on this CPU host's real runtimes, and with GPU packages
installed that cannot load here (onnxruntime-gpu, TensorRT's bindings, cuda-python)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgefleet.shared.executor.backends import gpu_reason
from tests.support.gpu_packages import env_with, gpu_packages_dir

BIN = Path(sys.executable).parent / "edgefleet"
GPU_BACKENDS = ["tensorrt", "onnxruntime-tensorrt", "onnxruntime-cuda"]


def _selftest(part: str, *options: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    done = subprocess.run(
        [str(BIN), part, "selftest", "--json", *options],
        capture_output=True,
        text=True,
        timeout=300,
        env=env or {**os.environ},
    )
    try:
        return done.returncode, json.loads(done.stdout)
    except ValueError:
        raise AssertionError(f"exit {done.returncode}: {done.stdout}{done.stderr}") from None


@pytest.mark.parametrize("part", ["edge", "cloud"])
def test_the_selftest_names_the_backend_and_provider_it_got(part: str):
    # given this host's onnxruntime (the CPU build), when each part's self-test runs
    code, report = _selftest(part)
    # then the tiny model ran on the CPU backend, and each GPU backend says why not
    assert code == 0, report
    assert report["ok"] and report["backend"] == "onnxruntime-cpu"
    assert report["provider"] == "CPUExecutionProvider"
    skipped = {s["backend"]: s["reason"] for s in report["skipped"]}
    assert list(skipped) == GPU_BACKENDS
    assert all(skipped.values())


def test_the_selftest_reads_the_agents_own_config(tmp_path: Path):
    # given an edge.yaml whose model may run on the CUDA provider only
    config = tmp_path / "edge.yaml"
    config.write_text(
        json.dumps(
            {
                "device_id": "cam-01",
                "device_key": "k",
                "model": {"execution": {"backends": ["onnxruntime-cuda"]}},
            }
        )
    )
    # when the self-test runs on it, then nothing ran: exit 1, and the reason
    code, report = _selftest("edge", "-c", str(config))
    assert code == 1, report
    assert not report["ok"] and report["backend"] is None and report["provider"] is None
    assert report["skipped"] == [
        {
            "backend": "onnxruntime-cuda",
            "reason": "this onnxruntime build has no CUDAExecutionProvider",
        }
    ]


def test_the_cloud_selftest_follows_the_environment():
    env = {**os.environ, "EDGEFLEET_CLOUD_EXECUTION__BACKENDS": '["onnxruntime-cpu"]'}
    code, report = _selftest("cloud", env=env)
    assert code == 0 and report["backend"] == "onnxruntime-cpu" and report["skipped"] == []


def test_gpu_packages_that_cannot_load_fail_their_proofs_and_the_cpu_runs_it():
    if gpu_reason() is None:
        pytest.skip("a GPU is visible here: these packages may well load on it")
    # given onnxruntime-gpu, TensorRT and cuda-python installed on a host without a GPU
    env = env_with(gpu_packages_dir())
    code, report = _selftest("cloud", env=env)
    # then each GPU backend was tried (a load of the tiny model, not an import) and failed
    # with what really failed; the CPU backend ran it
    assert code == 0, report
    assert report["backend"] == "onnxruntime-cpu"
    skipped = {s["backend"]: s["reason"] for s in report["skipped"]}
    assert list(skipped) == GPU_BACKENDS
    assert "failed its proof: ImportError: libnv" in skipped["tensorrt"]
    assert "did not start TensorrtExecutionProvider" in skipped["onnxruntime-tensorrt"]
    assert "did not start CUDAExecutionProvider" in skipped["onnxruntime-cuda"]
