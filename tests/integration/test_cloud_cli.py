"""`edgefleet cloud serve -c cloud.yaml` as a real process: ready with a broker, 503 with
the reason without one, and a clean exit on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from cloud.testing import free_port


def _serve(tmp: Path, mqtt_port: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    config = tmp / "cloud.yaml"
    config.write_text(
        json.dumps(
            {
                "http": {"port": port},
                "mqtt": {"host": "127.0.0.1", "port": mqtt_port},
                "data_dir": str(tmp / "data"),
                "models": {"served": ["ppocr"], "lighter": "ppocr"},
            }
        )
    )
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "edgefleet"), "cloud", "serve", "-c", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "serve.log").open("wb"),  # a file: a full pipe would block the server
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    return process, f"http://127.0.0.1:{port}"


def _poll(url: str, want: int, timeout_s: float = 120) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = httpx.get(url, timeout=10)
            if last.status_code == want:
                return last
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} never answered {want}: {last and last.text}")


def _stop(process: subprocess.Popen) -> int:
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()


def test_serve_is_ready_with_a_broker_and_exits_cleanly(broker, tmp_path: Path) -> None:
    process, url = _serve(tmp_path, broker.port)
    log_path = tmp_path / "serve.log"
    try:
        body = _poll(f"{url}/readyz", 200).json()
        assert body["broker"]["connected"] and body["models"][0]["warmed"]
        assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
        assert "ef_cloud_http_requests_total" in httpx.get(f"{url}/metrics").text
    finally:
        # uvicorn shuts down gracefully, then re-raises SIGTERM (exit status -15)
        status = _stop(process)
        log = log_path.read_text()
        assert status in (0, -signal.SIGTERM), log[-2000:]
        assert "Application shutdown complete" in log


def test_readyz_says_why_without_a_broker(tmp_path: Path) -> None:
    process, url = _serve(tmp_path, free_port())  # nothing listens there
    try:
        _poll(f"{url}/healthz", 200)
        deadline = time.monotonic() + 60
        while True:
            response = httpx.get(f"{url}/readyz", timeout=10)
            reasons = response.json()["reasons"]
            if reasons == ["broker not connected"]:  # once the model has warmed up
                break
            assert time.monotonic() < deadline, reasons
            time.sleep(0.2)
        assert response.status_code == 503 and response.headers["Retry-After"] == "5"
    finally:
        _stop(process)
