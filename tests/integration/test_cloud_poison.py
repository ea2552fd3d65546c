"""One device's message must not stop the cloud's ingest for the others (#32, finding 1).

A real Mosquitto on the generated config (ACLs, bound client ids), a real `edgefleet cloud
serve`, and `mosquitto_pub` as the attacker holding cam-a's credentials: a QoS 1 message on
its own telemetry topic with a byte order mark in a user property (valid MQTT 5, forwarded
by the broker, refused by paho's rules), plain and retained. cam-b's cases are answered
within 5 s throughout, across a cloud restart and a broker restart: the poison is refused,
counted and acknowledged, and what is retained is never replayed to the cloud. (A revoke
clears a device's retained topics: tests/integration/test_fleet_broker_acl.py.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest

from edgefleet.bench.harness import publish_cases, verdict_of
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.shared.db import Database
from edgefleet.shared.imaging import encode_png
from edgefleet.shared.mqtt import MqttSettings, connect, device_client_id, make_client
from tests.integration.test_cloud_crash import _serve
from tests.support.fleet import fleet_broker
from tests.support.waiting import eventually

BOM = "\ufeff"
ANSWER_S = 5.0


def _poison(port: int, password: str, *, retain: bool, where: str) -> None:
    """cam-a's poison, sent with the stock MQTT 5 client as the outside test did."""
    prop = {
        "user": ["-D", "publish", "user-property", "x", BOM],
        "content-type": ["-D", "publish", "content-type", f"application/json{BOM}"],
        "response-topic": ["-D", "publish", "response-topic", f"r{BOM}"],
    }[where]
    subprocess.run(
        ["mosquitto_pub", "-V", "5", "-h", "127.0.0.1", "-p", str(port), "-u", "cam-a",
         "-P", password, "-i", device_client_id("cam-a"), "-q", "1",
         *(["-r"] if retain else []), "-t", "ef/v1/cam-a/telemetry", "-m", "{}", *prop],
        check=True, timeout=30,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mosquitto_pub") is None, reason="needs mosquitto-clients")
def test_a_poison_message_plain_or_retained_stops_no_one_else(tmp_path: Path) -> None:
    data = tmp_path / "data"
    db = Database.connect(f"sqlite:///{data / 'cloud.db'}")
    registry = DeviceRegistry(db)
    cam_a, cam_b = registry.enroll("cam-a"), registry.enroll("cam-b")
    cloud_password = registry.accounts.ensure_service("cloud")
    assert cloud_password
    broker = fleet_broker(registry, tmp_path / "broker")
    db.close()
    rules = tmp_path / "rules.yaml"
    rules.write_text("default: {model: rules, timeout_s: 30}\n")
    config = tmp_path / "cloud.yaml"
    config.write_text(
        json.dumps(
            {
                "http": {"port": 0},
                "mqtt": {"host": broker.host, "port": broker.port, "username": "cloud",
                         "password": cloud_password},
                "data_dir": str(data),
                "rules": {"file": str(rules)},
                "models": {"preload": False},
            }
        )
    )  # fmt: skip
    answered: dict[str, threading.Event] = {}
    lock = threading.Lock()

    def on_message(client, userdata, message) -> None:
        verdict = verdict_of(message.payload)
        if verdict is not None:
            with lock:
                answered.setdefault(verdict.case_id, threading.Event()).set()

    settings = MqttSettings(
        host=broker.host, port=broker.port, username="cam-b", password=cam_b.broker_password
    )
    device = make_client(settings, device_client_id("cam-b"))
    subscribed = threading.Event()
    device.on_message = on_message
    device.on_subscribe = lambda *a: subscribed.set()
    device.on_connect = lambda c, *a: c.subscribe("ef/v1/cam-b/results", qos=1)
    connect(device, settings, clean_start=True)
    image = encode_png(np.zeros((32, 96, 3), np.uint8))
    log = tmp_path / "serve.log"

    def cam_b_is_answered(what: str) -> None:
        [case_id] = publish_cases(device, "cam-b", cam_b.device_key, 1, image)
        with lock:
            event = answered.setdefault(case_id, threading.Event())
        assert event.wait(ANSWER_S), f"cam-b's case got no verdict within {ANSWER_S} s {what}"

    cloud = _serve(config, log)
    try:
        _ready(log, cloud, 1)
        assert subscribed.wait(30)
        cam_b_is_answered("before the poison")
        # given cam-a's poison in every property that carries a string, sent plainly
        for where in ("user", "content-type", "response-topic"):
            _poison(broker.port, cam_a.broker_password, retain=False, where=where)
            cam_b_is_answered(f"after a poison in the {where}")
        metrics = httpx.get(_url(log) + "/metrics", timeout=5).text
        refused = 'ef_cloud_ingest_total{channel="telemetry",outcome="rejected_malformed"} 3.0'
        assert refused in metrics  # each counted, none redelivered
        # and retained
        _poison(broker.port, cam_a.broker_password, retain=True, where="user")
        cam_b_is_answered("after a retained poison")
        # when it is sent retained again while the cloud restarts, and the broker restarts
        cloud.terminate()
        cloud.wait(30)
        _poison(broker.port, cam_a.broker_password, retain=True, where="user")
        cloud = _serve(config, log)
        _ready(log, cloud, 2)
        cam_b_is_answered("after a cloud restart over a retained poison")
        _poison(broker.port, cam_a.broker_password, retain=True, where="content-type")
        subscribed.clear()
        broker.restart()
        _ready(log, cloud, 2)
        assert subscribed.wait(60)  # cam-b back on the restarted broker, subscribed again
        cam_b_is_answered("after a broker restart over a retained poison")
        # and the ingest never dropped its connection over the poison
        # (twice: the cloud's own stop, the broker's restart)
        text = log.read_text()
        assert text.count("ingest disconnected") == 2, text[-3000:]
        metrics = httpx.get(_url(log) + "/metrics", timeout=5).text
        assert 'ef_cloud_ingest_total{channel="telemetry",outcome="rejected_retained"}' in metrics
    finally:
        device.disconnect()
        device.loop_stop()
        cloud.terminate()
        cloud.wait(30)
        broker.stop()


def _url(log: Path) -> str:
    """The address the newest cloud process in `log` said it serves."""
    ports = re.findall(r"serving on 127\.0\.0\.1:(\d+)", log.read_text())
    return f"http://127.0.0.1:{ports[-1]}" if ports else ""


def _ready(log: Path, process: subprocess.Popen, starts: int) -> None:
    """/readyz 200 from the `starts`-th process written to `log`."""

    def ready() -> bool:
        assert process.poll() is None, "the cloud exited"
        if log.read_text().count("serving on") < starts:
            return False
        try:
            return httpx.get(_url(log) + "/readyz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    eventually(ready, 180, "the cloud ready", detail=lambda: log.read_text()[-2000:])
