"""A real Mosquitto configured from the generated password and ACL files enforces the rules."""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from fleet.acl import mosquitto_auth_config, reload_mosquitto, write_mosquitto_files
from fleet.registry import DeviceRegistry
from shared.db import Database
from tests.support.broker import MosquittoBroker

NOT_AUTHORIZED = 135


class Client:
    """A synchronous wrapper over one paho MQTT 5 client, for asserting broker answers."""

    def __init__(self, port: int, username: str, password: str):
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=f"t-{username}", protocol=mqtt.MQTTv5
        )
        self.client.username_pw_set(username, password)
        self.connack: queue.Queue[int] = queue.Queue()
        self.acks: dict[int, int] = {}
        self.subacks: dict[int, list[int]] = {}
        self.received: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self._cond = threading.Condition()
        self.client.on_connect = lambda c, u, f, rc, p: self.connack.put(rc.value)
        self.client.on_publish = self._on_publish
        self.client.on_subscribe = self._on_subscribe
        self.seen: list[str] = []  # every topic delivered, in order
        self.client.on_message = self._on_message
        self.port = port

    def _on_message(self, client, userdata, msg) -> None:
        self.seen.append(msg.topic)
        self.received.put(msg)

    def _on_publish(self, client, userdata, mid, rc, props) -> None:
        with self._cond:
            self.acks[mid] = rc.value
            self._cond.notify_all()

    def _on_subscribe(self, client, userdata, mid, rcs, props) -> None:
        with self._cond:
            self.subacks[mid] = [r.value for r in rcs]
            self._cond.notify_all()

    def connect(self) -> int:
        self.client.connect("127.0.0.1", self.port, clean_start=True)
        self.client.loop_start()
        try:
            return self.connack.get(timeout=20)
        except queue.Empty:
            return -1

    def publish(self, topic: str, payload: bytes = b"{}") -> int:
        """The PUBACK reason code of one QoS 1 publish."""
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [("ef-schema", "ef.telemetry/1")]
        info = self.client.publish(topic, payload, qos=1, properties=props)
        with self._cond:
            assert self._cond.wait_for(lambda: info.mid in self.acks, timeout=20)
            return self.acks[info.mid]

    def subscribe(self, topic: str) -> list[int]:
        _, mid = self.client.subscribe(topic, qos=1)
        with self._cond:
            assert self._cond.wait_for(lambda: mid in self.subacks, timeout=20)
            return self.subacks[mid]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def wait_received(client: Client, topic: str, timeout_s: float = 20) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            msg = client.received.get(timeout=0.2)
        except queue.Empty:
            continue
        if msg.topic == topic:
            return True
    return False


def run_as(pid_file: Path) -> str:
    """As root, Mosquitto drops to user `mosquitto`, who cannot read our 0600 temp files."""
    return f"pid_file {pid_file}\n" + ("user root\n" if os.geteuid() == 0 else "")


@pytest.fixture
def fleet(tmp_path: Path):
    db = Database.connect(f"sqlite:///{tmp_path}/fleet.db")
    registry = DeviceRegistry(db)
    enrollments = {d: registry.enroll(d, group="lab") for d in ("cam-01", "cam-02")}
    cloud_password = registry.ensure_service_account("cloud")
    files = write_mosquitto_files(registry, tmp_path / "auth")
    pid_file = tmp_path / "mosquitto.pid"
    broker = MosquittoBroker(
        tmp_path / "broker", extra_config=mosquitto_auth_config(files) + run_as(pid_file)
    ).start()
    clients: list[Client] = []

    def client(user: str, password: str) -> Client:
        c = Client(broker.port, user, password)
        clients.append(c)
        return c

    yield registry, enrollments, cloud_password, files, broker, pid_file, client
    for c in clients:
        c.close()
    broker.kill()
    db.close()


def test_device_publishes_only_under_its_own_id(fleet) -> None:
    _, enrollments, cloud_password, _, _, _, client = fleet
    # given the cloud service account subscribed to everything, and cam-01 connected
    cloud = client("cloud", cloud_password)
    assert cloud.connect() == 0
    assert cloud.subscribe("ef/v1/#") == [1]
    cam = client("cam-01", enrollments["cam-01"].broker_password)
    assert cam.connect() == 0
    # when it publishes on its own telemetry topic, the broker accepts and relays it
    assert cam.publish("ef/v1/cam-01/telemetry") == 0
    assert wait_received(cloud, "ef/v1/cam-01/telemetry")
    # when it publishes under cam-02's id, the broker answers "not authorized"
    assert cam.publish("ef/v1/cam-02/telemetry") == NOT_AUTHORIZED
    assert cam.publish("ef/v1/cam-01/desired") == NOT_AUTHORIZED
    # and the subscriber never sees the forged message (a marker sent after it arrives first)
    assert cam.publish("ef/v1/cam-01/status") == 0
    assert wait_received(cloud, "ef/v1/cam-01/status")
    assert "ef/v1/cam-02/telemetry" not in cloud.seen


def test_device_reads_only_its_own_results_and_desired(fleet) -> None:
    _, enrollments, cloud_password, _, _, _, client = fleet
    # given cam-01 subscribed to its own topics and (trying) to cam-02's and to everything
    cam = client("cam-01", enrollments["cam-01"].broker_password)
    assert cam.connect() == 0
    cam.subscribe("ef/v1/cam-02/desired")
    cam.subscribe("ef/v1/cam-02/results")
    cam.subscribe("ef/v1/#")
    cloud = client("cloud", cloud_password)
    assert cloud.connect() == 0
    # when the cloud writes cam-02's desired and results, then cam-01's (a marker)
    assert cloud.publish("ef/v1/cam-02/desired") == 0
    assert cloud.publish("ef/v1/cam-02/results") == 0
    assert cloud.publish("ef/v1/cam-01/results") == 0
    assert cloud.publish("ef/v1/cam-01/desired") == 0
    # then cam-01 receives its own, and never cam-02's (Mosquitto filters at delivery)
    assert wait_received(cam, "ef/v1/cam-01/results")
    assert wait_received(cam, "ef/v1/cam-01/desired")
    assert not [t for t in cam.seen if "cam-02" in t]
    # and the cloud may not impersonate a device's telemetry
    assert cloud.publish("ef/v1/cam-01/telemetry") == NOT_AUTHORIZED


def test_cloud_uses_shared_subscriptions(fleet) -> None:
    _, enrollments, cloud_password, _, _, _, client = fleet
    cloud = client("cloud", cloud_password)
    assert cloud.connect() == 0
    assert cloud.subscribe("$share/ingest/ef/v1/+/telemetry") == [1]
    cam = client("cam-02", enrollments["cam-02"].broker_password)
    assert cam.connect() == 0
    assert cam.publish("ef/v1/cam-02/telemetry") == 0
    assert wait_received(cloud, "ef/v1/cam-02/telemetry")


def test_wrong_password_and_revoked_device_cannot_connect(fleet) -> None:
    registry, enrollments, _, files, _, pid_file, client = fleet
    assert client("cam-02", "not-the-password").connect() not in (0, -1)
    assert client("cam-02", enrollments["cam-02"].broker_password).connect() == 0
    # when cam-02 is revoked and the broker reloads the regenerated files
    registry.revoke("cam-02")
    write_mosquitto_files(registry, files.password_file.parent)
    reload_mosquitto(pid_file)
    # then a new connection with its old password is refused (polling: reload is async)
    deadline = time.monotonic() + 20
    refused = False
    while time.monotonic() < deadline and not refused:
        attempt = client("cam-02", enrollments["cam-02"].broker_password)
        refused = attempt.connect() not in (0, -1)
        attempt.close()
    assert refused
    # and cam-01 is unaffected
    assert client("cam-01", enrollments["cam-01"].broker_password).connect() == 0
