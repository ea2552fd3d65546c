"""`kill -9` of a real `edgefleet cloud serve` in the middle of ingest, then a restart:
every case the broker acknowledged to the device is answered, none is lost in an orphan
session, and a case that was being processed when the process died is run again."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import numpy as np
import pytest

from edgefleet.bench.harness import publish_cases, verdict_of
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.shared.db import Database
from edgefleet.shared.imaging import encode_png
from edgefleet.shared.messages import DeviceTelemetry, EscalationCounters
from edgefleet.shared.mqtt import MqttSettings, connect, device_client_id, make_client, publish
from edgefleet.shared.topics import Topics
from edgefleet.shared.wire import encode
from tests.support.waiting import eventually


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
    url: list[str] = []

    def ready() -> bool:
        assert process.poll() is None, "the cloud exited during start-up"
        if not url and (served := re.search(r"serving on 127\.0\.0\.1:(\d+)", log.read_text())):
            url.append(f"http://127.0.0.1:{served.group(1)}")
        try:
            return bool(url) and httpx.get(f"{url[0]}/readyz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    eventually(
        ready, timeout_s, "the cloud ready", detail=lambda: log.read_text()[-2000:], interval_s=0.2
    )


def _rules(tmp_path: Path) -> dict:
    rules = tmp_path / "rules.yaml"
    rules.write_text("default: {model: rules, timeout_s: 30}\n")
    return {"rules": {"file": str(rules)}, "models": {"preload": False}}


ROUTES = {
    # 60 cases of a real OCR model on 960x540 noise: the kill lands while cases run one
    # per worker
    "model": (60, (540, 960), lambda tmp: {"models": {"primary": "ppocr", "served": ["ppocr"]}}),
    # 1,500 cases that need no model: the kill lands among batches (claims committed,
    # verdicts not yet stored)
    "rules": (1500, (32, 96), _rules),
}


@pytest.mark.slow
@pytest.mark.parametrize("route", ["model", "rules"])
def test_a_cloud_killed_mid_ingest_answers_every_case_after_restart(
    own_broker, tmp_path: Path, route: str
) -> None:
    n_cases, (h, w), options = ROUTES[route]
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
                "models": {"lighter": "ppocr"},
                "queue": {"workers": 2},
            }
            | options(tmp_path)
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
            if len(seen) >= n_cases:
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
        # given a busy cloud: its cases all acked to the device
        noise = np.random.default_rng(7).integers(0, 255, (h, w, 3), dtype=np.uint8)
        case_ids = publish_cases(device, "cam-k9", cam.device_key, n_cases, encode_png(noise))
        # when it is killed -9 as soon as it has answered one
        assert first.wait(120)
        cloud.kill()
        cloud.wait()
        answered_before = len(seen)
        assert answered_before < n_cases, "all answered before the kill: nothing was tested"
        # and started again on the same data folder
        cloud = _serve(config, tmp_path / "serve.log")
        # then every case is answered: its session was resumed, in-flight cases re-run
        assert every.wait(300), f"{len(seen)} of {n_cases} answered; {answered_before} before"
        assert set(seen) == set(case_ids)
        # and it came back as the same replica (one identity, locked again)
        assert [p.name for p in (data / "replicas").iterdir()] == [
            next((data / "replicas").iterdir()).name
        ]
        stored = Database.connect(f"sqlite:///{data / 'cloud.db'}")
        pending = stored.query("SELECT case_id FROM ef_cases WHERE status != 'done'")
        runs = stored.query(
            "SELECT completed_runs AS n, COUNT(*) AS cases FROM ef_cases GROUP BY 1"
        )
        stored.close()
        assert pending == []
        # and none was run to a verdict twice, the one cut short by the kill included
        assert {row["n"]: row["cases"] for row in runs} == {1: n_cases}
    finally:
        cloud.kill()
        cloud.wait()
        device.loop_stop()
        device.disconnect()


N_DEVICES, PER_DEVICE = 40, 250


def _history_rows(db_path: Path) -> int:
    """Telemetry samples committed so far (read-only, beside the running cloud)."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)
    try:
        return conn.execute("SELECT COUNT(*) FROM fleet_telemetry_history").fetchone()[0]
    except sqlite3.OperationalError:  # the cloud has not created its tables yet
        return 0
    finally:
        conn.close()


@pytest.mark.slow
def test_a_cloud_killed_mid_telemetry_batch_stores_every_message_once(
    own_broker, tmp_path: Path
) -> None:
    # given devices whose telemetry each lands in a history bucket of its own (1 s buckets,
    # one message per second of ts), so every message leaves exactly one row to count
    data = tmp_path / "data"
    db_path = data / "cloud.db"
    db = Database.connect(f"sqlite:///{db_path}")
    registry = DeviceRegistry(db)
    keys = {f"tm-{i:02d}": registry.enroll(f"tm-{i:02d}").device_key for i in range(N_DEVICES)}
    db.close()
    config = tmp_path / "cloud.yaml"
    config.write_text(
        json.dumps(
            {
                "http": {"port": 0},
                "mqtt": {"host": own_broker.host, "port": own_broker.port},
                "data_dir": str(data),
                "models": {"preload": False},
                "telemetry": {"bucket_s": 1},
                "ingest": {"max_skew_s": 3600},
            }
        )
    )
    base = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(seconds=1800)
    messages = [
        DeviceTelemetry(
            device_id=device,
            ts=base + timedelta(seconds=seq),
            seq=seq,
            uptime_s=float(seq),
            escalations=EscalationCounters(sent=0, pending=0, dropped=0),
            outbox_depth=seq,
            cpu_pct=1.0,
            ram_used_mb=1.0,
        )
        for seq in range(1, PER_DEVICE + 1)
        for device in keys
    ]
    topics = Topics()
    wires = [encode(m, keys[m.device_id], topics.telemetry(m.device_id)) for m in messages]
    settings = MqttSettings(host=own_broker.host, port=own_broker.port, max_inflight=1000)
    fleet = make_client(settings, "fleet-of-40")
    connect(fleet, settings, clean_start=True)
    cloud = _serve(config, tmp_path / "serve.log")
    try:
        _ready(tmp_path / "serve.log", cloud)
        # when 10,000 are published at once and the cloud is killed -9 while storing them
        infos = [publish(fleet, wire, qos=1) for wire in wires]
        partial = len(messages) // 5
        eventually(lambda: _history_rows(db_path) >= partial, 120, "some telemetry stored")
        cloud.kill()
        cloud.wait()
        at_kill = _history_rows(db_path)
        assert at_kill < len(messages), "all stored before the kill: nothing was tested"
        for info in infos:  # every message is with the broker (QoS 1 acknowledged)
            info.wait_for_publish(60)
        # and started again on the same data folder
        cloud = _serve(config, tmp_path / "restart.log")
        _ready(tmp_path / "restart.log", cloud)
        eventually(lambda: _history_rows(db_path) >= len(messages), 180, "every message stored")
        # then every message is stored, each once: one row per message, with its own values
        stored = Database.connect(f"sqlite:///{db_path}")
        rows = stored.query("SELECT device_id, bucket, outbox_depth FROM fleet_telemetry_history")
        devices = stored.query("SELECT device_id, telemetry FROM fleet_devices")
        stored.close()
        expected = {(m.device_id, int(m.ts.timestamp()), m.outbox_depth) for m in messages}
        found = [(r["device_id"], r["bucket"], r["outbox_depth"]) for r in rows]
        assert len(found) == len(expected) and set(found) == expected
        # and each device's telemetry is its newest, whatever came again after the restart
        newest = {d["device_id"]: json.loads(d["telemetry"])["seq"] for d in devices}
        assert newest == dict.fromkeys(keys, PER_DEVICE)
    finally:
        cloud.kill()
        cloud.wait()
        fleet.loop_stop()
        fleet.disconnect()
