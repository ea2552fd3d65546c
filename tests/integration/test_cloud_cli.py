"""`edgefleet cloud serve -c cloud.yaml` as a real process: ready with a broker, 503 with
the reason without one, and a clean exit on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from edgefleet.bench.mosquitto import free_port
from tests.support.fleet import tiny_onnx
from tests.support.waiting import eventually


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
    last: list[httpx.Response] = []

    def answers() -> bool:
        try:
            last[:] = [httpx.get(url, timeout=10)]
        except httpx.TransportError:
            return False
        return last[0].status_code == want

    eventually(
        answers,
        timeout_s,
        f"{url} to answer {want}",
        detail=lambda: last and last[0].text,
        interval_s=0.2,
    )
    return last[0]


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
        last: list[httpx.Response] = []

        def only_the_broker_missing() -> bool:
            last[:] = [httpx.get(f"{url}/readyz", timeout=10)]
            return last[0].json()["reasons"] == ["broker not connected"]  # the model warmed

        eventually(
            only_the_broker_missing,
            60,
            "readyz to name only the broker",
            detail=lambda: last and last[0].json()["reasons"],
            interval_s=0.2,
        )
        response = last[0]
        assert response.status_code == 503 and response.headers["Retry-After"] == "5"
    finally:
        _stop(process)


def test_port_flag_is_the_port_served_and_the_one_download_links_name(tmp_path: Path) -> None:
    # given: a device and a model in the store, and a config that names another port
    from typer.testing import CliRunner

    from edgefleet.cloud.auth import key_digest
    from edgefleet.fleet.cli import app as fleet_cli

    data_dir, key = tmp_path / "data", "op-serve-key-" + "s" * 20
    fleet_env = {
        "EDGEFLEET_FLEET_DATA_DIR": str(data_dir),
        "EDGEFLEET_FLEET_BUNDLES_DIR": str(tmp_path / "bundles"),
    }
    model = tiny_onnx(tmp_path / "det.onnx")
    for args in (["enroll", "cam-s1", "--group", "dock"], ["model-add", "det", "1.0", str(model)]):
        done = CliRunner().invoke(fleet_cli, args, env=fleet_env)
        assert done.exit_code == 0, done.output
    config = tmp_path / "cloud.yaml"
    config.write_text(
        json.dumps(
            {
                "http": {"port": free_port()},
                "data_dir": str(data_dir),
                "ingest": {"enabled": False},
                "models": {"preload": False},
                "api_keys": [{"name": "ops", "sha256": key_digest(key)}],
            }
        )
    )
    port = free_port()
    # when: `--port` overrides it
    process = subprocess.Popen(
        [
            *(str(Path(sys.executable).parent / "edgefleet"), "cloud", "serve", "-c", str(config)),
            *("--host", "127.0.0.1", "--port", str(port)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "serve.log").open("wb"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _poll(f"{url}/readyz", 200)
        created = httpx.post(
            f"{url}/v1/deployments",
            json={"group": "dock", "image": "ghcr.io/acme/edge@sha256:" + "1" * 64, "soak_s": 0}
            | {"models": [{"name": "det", "version": "1.0"}]},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        # then: the deployment's download link names the port really served
        assert created.status_code == 201, created.text
        assert created.json()["models"][0]["url"] == f"{url}/v1/models/det/1.0"
    finally:
        _stop(process)


def test_port_zero_serves_a_free_port_that_the_settings_know(tmp_path: Path) -> None:
    import re

    config = tmp_path / "cloud.yaml"
    config.write_text(
        json.dumps(
            {
                "data_dir": str(tmp_path / "data"),
                "ingest": {"enabled": False},
                "models": {"preload": False},
            }
        )
    )
    log_path = tmp_path / "serve.log"
    # when: any free port is asked for
    process = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "edgefleet"),
            "cloud",
            "serve",
            "-c",
            str(config),
            "--port",
            "0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log_path.open("wb"),
    )
    try:

        def serving() -> re.Match[str] | None:
            return re.search(
                r"serving on 127\.0\.0\.1:(\d+); download links name "
                r"http://127\.0\.0\.1:(\d+)",
                log_path.read_text(),
            )

        def said_or_died() -> bool:
            if serving() is not None:
                return True
            assert process.poll() is None, log_path.read_text()
            return False

        eventually(said_or_died, 120, "the server's port in its log", detail=log_path.read_text)
        # then: the port it says it serves is the port the links name, and it answers there
        found = serving()
        assert found is not None
        port, linked = found.groups()
        assert port == linked and port != "0"
        assert _poll(f"http://127.0.0.1:{port}/readyz", 200).json()["ready"] is True
    finally:
        _stop(process)
