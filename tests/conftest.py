"""Shared fixtures: a real Mosquitto broker, PostgreSQL, the edge's OCR model, and hardware
markers that skip with a reason."""

from __future__ import annotations

import importlib.util
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgefleet.shared.logs import StderrHandler
from tests.support.broker import MosquittoBroker


def _has_nvidia_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return count > 0
    except Exception:  # NVML missing or no driver: no GPU here
        return False


def _has_gstreamer() -> bool:
    from edgefleet.edge.sources.opencv import has_gstreamer

    return has_gstreamer()


_HARDWARE = {
    "gpu": (_has_nvidia_gpu, "needs an NVIDIA GPU (NVML found none here)"),
    "jetson": (lambda: Path("/etc/nv_tegra_release").exists(), "needs a Jetson (no L4T here)"),
    "trt": (lambda: importlib.util.find_spec("tensorrt") is not None, "needs TensorRT"),
    "gstreamer": (_has_gstreamer, "needs OpenCV built with GStreamer (this one has none)"),
    "docker": (
        lambda: all(shutil.which(b) for b in ("dockerd", "docker-registry", "busybox")),
        "needs dockerd, docker-registry and busybox: apt-get install docker.io docker-registry "
        "busybox-static (make test does)",
    ),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    present: dict[str, bool] = {}
    for item in items:
        for marker, (probe, reason) in _HARDWARE.items():
            if marker in item.keywords:
                if marker not in present:
                    present[marker] = probe()
                if not present[marker]:
                    item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MosquittoBroker]:
    """One broker for the session, for tests that do not stop it."""
    instance = MosquittoBroker(tmp_path_factory.mktemp("mosquitto")).start()
    yield instance
    instance.kill()


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    """A broker of this test's own, which it may stop, kill and restart."""
    instance = MosquittoBroker(tmp_path / "mosquitto").start()
    yield instance
    instance.kill()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """PostgreSQL for the session: the machine's own, else a disposable one (never a skip)."""
    from tests.support.postgres import postgres_server

    with postgres_server() as url:
        yield url


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """A fresh schema on the session's PostgreSQL for this test, dropped afterwards."""
    import secrets

    import psycopg

    schema = f"ef_test_{secrets.token_hex(6)}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{pg_server}?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(scope="session")
def image_registry() -> Iterator[Any]:
    """A real image registry (Debian's docker-registry) on loopback, for the session."""
    from tests.support.registry import registry_server

    with registry_server() as registry:
        yield registry


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A real Docker engine: the machine's own, else a dockerd started for the session."""
    from tests.support.docker_engine import docker_engine

    with docker_engine() as client:
        yield client


@pytest.fixture(scope="module")
def tiny() -> Iterator[Any]:
    """The edge's OCR model (`ppocr6-tiny`) as shipped: one thread, no batcher. One per
    module, so that a test module's changes to its options stay in that module."""
    from edgefleet.shared.executor.settings import BatcherSettings, ExecutionSettings
    from edgefleet.shared.models import load_model

    settings = ExecutionSettings(
        backends=["onnxruntime-cpu"], intra_op_threads=1, batching=BatcherSettings(enabled=False)
    )
    with load_model("ppocr6-tiny", settings=settings) as model:
        yield model


@pytest.fixture(autouse=True)
def _root_logging() -> Iterator[None]:
    """A CLI run in a test configures the root logger (its handler and level); the next
    test starts without that, as a fresh process would."""
    level = logging.getLogger().level
    yield
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, StderrHandler)]:
        root.removeHandler(handler)
    root.setLevel(level)
