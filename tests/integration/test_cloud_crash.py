"""`kill -9` of a real `edgefleet cloud serve` in the middle of ingest, then a restart:
every case the broker acknowledged to the device is answered, none is lost in an orphan
session, and a case that was being processed when the process died is run again."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from edgefleet.bench.harness import publish_cases, verdict_of
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.shared.db import Database
from edgefleet.shared.imaging import encode_png
from edgefleet.shared.mqtt import MqttSettings, connect, device_client_id, make_client

N_CASES = 60


def _serve(config: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "edgefleet"), "cloud", "serve", "-c", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _ready(log: Path, process: subprocess.Popen, timeout_s: float = 180) -> None:
    """Wait for /readyz on the port the cloud says it serves (it picks a free one itself:
    no port handed over between a probe and its bind, which another process could take)."""
    deadline = time.monotonic() + timeout_s
    url = None
    while time.monotonic() < deadline:
        assert process.poll() is None, "the cloud exited during start-up"
        if url is None:
            served = re.search(r"serving on 127\.0\.0\.1:(\d+)", log.read_text())
            url = served and f"http://127.0.0.1:{served.group(1)}"
        try:
            if url and httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("the cloud never became ready")


@pytest.mark.slow
def test_a_cloud_killed_mid_ingest_answers_every_case_after_restart(
    own_broker, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    db = Database.connect(f"sqlite:///{data / 'cloud.db'}")
    cam = DeviceRegistry(db).enroll("cam-k9")
    db.close()
    config = tmp_path / "cloud.yaml"
    config.write_text(
        json.dumps(
            {
                "http": {"port": 0},
                "mqtt": {"host": own_broker.host, "port": own_broker.port},
                "data_dir": str(data),
                "models": {"primary": "ppocr", "served": ["ppocr"], "lighter": "ppocr"},
                "queue": {"workers": 2},
            }
        )
    )
    seen: dict[str, int] = {}
    lock = threading.Lock()
    first, every = threading.Event(), threading.Event()

    def on_message(client, userdata, message) -> None:
        verdict = verdict_of(message.payload)
        if verdict is None:  # the cloud's lag status
            return
        with lock:
            seen[verdict.case_id] = seen.get(verdict.case_id, 0) + 1
            first.set()
            if len(seen) >= N_CASES:
                every.set()

    settings = MqttSettings(host=own_broker.host, port=own_broker.port)
    device = make_client(settings, device_client_id("cam-k9"))
    subscribed = threading.Event()
    device.on_message = on_message
    device.on_subscribe = lambda *a: subscribed.set()
    device.on_connect = lambda c, *a: c.subscribe("ef/v1/cam-k9/results", qos=1)
    connect(device, settings, clean_start=True)
    cloud = _serve(config, tmp_path / "serve.log")
    try:
        _ready(tmp_path / "serve.log", cloud)
        assert subscribed.wait(30)
        # given a busy cloud: 60 cases of a real OCR model, all acked to the device
        noise = np.random.default_rng(7).integers(0, 255, (540, 960, 3), dtype=np.uint8)
        case_ids = publish_cases(device, "cam-k9", cam.device_key, N_CASES, encode_png(noise))
        # when it is killed -9 as soon as it has answered one
        assert first.wait(120)
        cloud.kill()
        cloud.wait()
        answered_before = len(seen)
        assert answered_before < N_CASES, "all answered before the kill: nothing was tested"
        # and started again on the same data folder
        cloud = _serve(config, tmp_path / "serve.log")
        # then every case is answered: its session was resumed, in-flight cases re-run
        assert every.wait(300), f"{len(seen)} of {N_CASES} answered; {answered_before} before"
        assert set(seen) == set(case_ids)
        # and it came back as the same replica (one identity, locked again)
        assert [p.name for p in (data / "replicas").iterdir()] == [
            next((data / "replicas").iterdir()).name
        ]
        stored = Database.connect(f"sqlite:///{data / 'cloud.db'}")
        pending = stored.query("SELECT case_id FROM ef_cases WHERE status != 'done'")
        stored.close()
        assert pending == []
    finally:
        cloud.kill()
        cloud.wait()
        device.loop_stop()
        device.disconnect()
