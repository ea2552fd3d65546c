"""A real Mosquitto run from the generated config enforces the rules, as an attacker holding
one device's credentials would try them: publish, subscribe (shared ones too), reuse
another client's id, stay connected through a revoke."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgefleet.fleet.broker_control import BrokerControl
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.shared.db import Database
from edgefleet.shared.mqtt import device_client_id
from tests.support.fleet import fleet_broker
from tests.support.waiting import eventually

NOT_AUTHORIZED = 135
NO_SUBSCRIBERS = 16  # a success: nobody may read it


class Client:
    """A synchronous wrapper over one paho MQTT 5 client, for asserting broker answers."""

    def __init__(self, port: int, username: str | None, password: str | None, client_id: str):
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
        )
        if username is not None:
            self.client.username_pw_set(username, password)
        self.disconnected = threading.Event()
        self.client.on_disconnect = lambda *args: self.disconnected.set()
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

    def connect(self, clean_start: bool = True) -> int:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 0 if clean_start else 600
        self.client.connect("127.0.0.1", self.port, clean_start=clean_start, properties=props)
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


def wait_received(client: Client, topic: str, timeout_s: float = 20) -> None:
    def arrived() -> bool:
        while True:
            try:
                msg = client.received.get_nowait()
            except queue.Empty:
                return False
            if msg.topic == topic:
                return True

    eventually(arrived, timeout_s, f"a message on {topic}", detail=lambda: client.seen)


@pytest.fixture
def fleet(tmp_path: Path):
    db = Database.connect(f"sqlite:///{tmp_path}/fleet.db")
    registry = DeviceRegistry(db)
    enrollments = {d: registry.enroll(d, group="lab") for d in ("cam-01", "cam-02")}
    cloud_password = registry.accounts.ensure_service("cloud")
    admin_password = registry.accounts.ensure_service("ef-admin")
    broker = fleet_broker(registry, tmp_path / "broker")
    clients: list[Client] = []

    def client(user: str | None, password: str | None, client_id: str | None = None) -> Client:
        if client_id is None:
            client_id = device_client_id(user) if user and user.startswith("cam") else f"t-{user}"
        c = Client(broker.port, user, password, client_id)
        clients.append(c)
        return c

    control = BrokerControl("127.0.0.1", broker.port, admin_password)
    yield registry, enrollments, cloud_password, control, broker, client
    for c in clients:
        c.close()
    broker.kill()
    db.close()


def test_device_publishes_only_under_its_own_id(fleet) -> None:
    _, enrollments, cloud_password, _, _, client = fleet
    # given the cloud service account subscribed to everything, and cam-01 connected
    cloud = client("cloud", cloud_password)
    assert cloud.connect() == 0
    assert cloud.subscribe("ef/v1/#") == [1]
    cam = client("cam-01", enrollments["cam-01"].broker_password)
    assert cam.connect() == 0
    # when it publishes on its own telemetry topic, the broker accepts and relays it
    assert cam.publish("ef/v1/cam-01/telemetry") == 0
    wait_received(cloud, "ef/v1/cam-01/telemetry")
    # when it publishes under cam-02's id, the broker answers "not authorized"
    assert cam.publish("ef/v1/cam-02/telemetry") == NOT_AUTHORIZED
    assert cam.publish("ef/v1/cam-01/desired") == NOT_AUTHORIZED
    # and the subscriber never sees the forged message (a marker sent after it arrives first)
    assert cam.publish("ef/v1/cam-01/status") == 0
    wait_received(cloud, "ef/v1/cam-01/status")
    assert "ef/v1/cam-02/telemetry" not in cloud.seen


def test_device_reads_only_its_own_results_and_desired(fleet) -> None:
    _, enrollments, cloud_password, _, _, client = fleet
    # given cam-01 subscribed to its own topics and (trying) to cam-02's and to everything
    cam = client("cam-01", enrollments["cam-01"].broker_password)
    assert cam.connect() == 0
    assert cam.subscribe("ef/v1/cam-02/desired") == [NOT_AUTHORIZED]
    assert cam.subscribe("ef/v1/cam-02/results") == [NOT_AUTHORIZED]
    assert cam.subscribe("ef/v1/#") == [NOT_AUTHORIZED]
    assert cam.subscribe("ef/v1/cam-01/results") == [1]
    assert cam.subscribe("ef/v1/cam-01/desired") == [1]
    cloud = client("cloud", cloud_password)
    assert cloud.connect() == 0
    # when the cloud writes cam-02's desired and results, then cam-01's (a marker)
    assert cloud.publish("ef/v1/cam-02/desired") in (0, NO_SUBSCRIBERS)
    assert cloud.publish("ef/v1/cam-02/results") in (0, NO_SUBSCRIBERS)
    assert cloud.publish("ef/v1/cam-01/results") == 0
    assert cloud.publish("ef/v1/cam-01/desired") == 0
    # then cam-01 receives its own, and never cam-02's
    wait_received(cam, "ef/v1/cam-01/results")
    wait_received(cam, "ef/v1/cam-01/desired")
    assert not [t for t in cam.seen if "cam-02" in t]
    # and the cloud may not impersonate a device's telemetry
    assert cloud.publish("ef/v1/cam-01/telemetry") == NOT_AUTHORIZED


def test_cloud_uses_shared_subscriptions(fleet) -> None:
    _, enrollments, cloud_password, _, _, client = fleet
    cloud = client("cloud", cloud_password)
    assert cloud.connect() == 0
    assert cloud.subscribe("$share/ingest/ef/v1/+/telemetry") == [1]
    cam = client("cam-02", enrollments["cam-02"].broker_password)
    assert cam.connect() == 0
    assert cam.publish("ef/v1/cam-02/telemetry") == 0
    wait_received(cloud, "ef/v1/cam-02/telemetry")


def test_device_cannot_join_the_clouds_share_group_or_read_wide(fleet) -> None:
    _, enrollments, cloud_password, _, _, client = fleet
    # given the cloud in its share group, and cam-01's stolen credentials
    cloud = client("cloud", cloud_password)
    assert cloud.connect() == 0
    assert cloud.subscribe("$share/ef-secret/ef/v1/+/telemetry") == [1]
    thief = client("cam-01", enrollments["cam-01"].broker_password)
    assert thief.connect(clean_start=False) == 0
    # when the thief subscribes to the share group (any name), or wide, it is refused
    for topic in (
        "$share/ef-secret/ef/v1/+/telemetry",
        "$share/ef-secret/ef/v1/#",
        "$share/guess/ef/v1/cam-01/results",
        "ef/v1/+/telemetry",
        "ef/v1/#",
        "#",
        "$CONTROL/dynamic-security/v1/response",
        "ef/v1/cam-02/results",
    ):
        assert thief.subscribe(topic) == [NOT_AUTHORIZED], topic
    # then not one of cam-02's messages is lost to the thief's would-be share
    cam = client("cam-02", enrollments["cam-02"].broker_password)
    assert cam.connect() == 0
    for _ in range(40):
        assert cam.publish("ef/v1/cam-02/telemetry") == 0
    eventually(
        lambda: len(cloud.seen) >= 40, 20, "40 messages delivered", detail=lambda: cloud.seen
    )
    assert cloud.seen.count("ef/v1/cam-02/telemetry") == 40
    # and its own topics still work
    assert thief.subscribe("ef/v1/cam-01/results") == [1]


def test_device_cannot_take_over_another_clients_session(fleet) -> None:
    _, enrollments, cloud_password, _, _, client = fleet
    owner = client("cam-01", enrollments["cam-01"].broker_password)
    assert owner.connect(clean_start=False) == 0
    cloud = client("cloud", cloud_password, client_id="cloud-0123abcd")
    assert cloud.connect(clean_start=False) == 0
    thief_password = enrollments["cam-02"].broker_password
    # when cam-02 connects with cam-01's id, the cloud's id, or any id but its own
    for victim in ("ef-edge-cam-01", "cloud-0123abcd", "anything-else"):
        attempt = client("cam-02", thief_password, client_id=victim)
        assert attempt.connect() not in (0, -1), victim
    # then the owners were never kicked off
    assert not owner.disconnected.is_set() and not cloud.disconnected.is_set()
    assert owner.publish("ef/v1/cam-01/status") in (0, NO_SUBSCRIBERS)
    # and anonymous clients are refused outright
    assert client(None, None, client_id="anon").connect() not in (0, -1)


def test_wrong_password_is_refused_and_revocation_bites_at_once(fleet) -> None:
    registry, enrollments, _, control, _, client = fleet
    assert client("cam-02", "not-the-password").connect() not in (0, -1)
    online = client("cam-02", enrollments["cam-02"].broker_password)
    assert online.connect() == 0
    # when cam-02 is revoked through the running broker's control API
    registry.revoke("cam-02")
    control.remove_device("cam-02")
    # then its live connection is dropped at once, and it cannot come back
    assert online.disconnected.wait(20)
    again = client("cam-02", enrollments["cam-02"].broker_password)
    assert again.connect() not in (0, -1)
    # and cam-01 is unaffected
    assert client("cam-01", enrollments["cam-01"].broker_password).connect() == 0


def test_a_device_enrolled_while_the_broker_runs_can_connect_at_once(fleet) -> None:
    registry, _, _, control, _, client = fleet
    new = registry.enroll("cam-03", group="lab")
    assert client("cam-03", new.broker_password).connect() not in (0, -1)  # unknown yet
    control.add_device("cam-03", new.broker_password)
    cam = client("cam-03", new.broker_password)
    assert cam.connect() == 0
    assert cam.publish("ef/v1/cam-03/telemetry") in (0, NO_SUBSCRIBERS)
    assert cam.publish("ef/v1/cam-01/telemetry") == NOT_AUTHORIZED


def _retained(port: int, password: str, topic: str) -> int:
    """How many retained messages the broker holds under `topic`, read as the cloud."""
    seen: list[str] = []
    reader = Client(port, "cloud", password, "ef-test-retained-reader")
    assert reader.connect() == 0
    done = threading.Event()
    reader.client.on_message = lambda c, u, msg: seen.append(msg.topic) if msg.retain else None
    reader.client.on_subscribe = lambda *a: done.set()
    reader.client.subscribe(topic, qos=1)
    assert done.wait(20)
    # retained messages come right after the SUBACK: a round trip after it has them all
    reader.client.publish("ef/v1/ef-probe/results", b"", qos=1).wait_for_publish(20)
    reader.close()
    return len(seen)


def test_cli_enroll_and_revoke_reach_the_running_broker(tmp_path: Path) -> None:
    import yaml
    from typer.testing import CliRunner

    from edgefleet.cli import app
    from tests.support.broker import MosquittoBroker, free_port

    def fleet_cli(*args: str):
        return CliRunner().invoke(app, ["fleet", *args, "-c", str(cfg)], catch_exceptions=False)

    port = free_port()
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "data_dir": str(tmp_path / "data"),
                "bundles_dir": str(tmp_path / "bundles"),
                "broker_port": port,
                "broker_bind": "127.0.0.1",
            }
        )
    )
    # given the broker started from what `fleet broker-files` wrote, and nothing else
    assert fleet_cli("broker-files").exit_code == 0
    folder = tmp_path / "data" / "broker"
    broker = MosquittoBroker(folder, port, generated=folder / "mosquitto.conf").start()
    try:
        # when a device is enrolled while it runs, it can connect at once
        enrolled = fleet_cli("enroll", "cam-07")
        assert enrolled.exit_code == 0 and "applied to the running broker" in enrolled.output
        secrets = yaml.safe_load((tmp_path / "bundles" / "cam-07" / "secrets.yaml").read_text())
        device = Client(port, "cam-07", secrets["broker_password"], "ef-edge-cam-07")
        assert device.connect() == 0
        # which leaves retained messages behind, on a channel that retains and one that does not
        for channel in ("status", "telemetry"):
            info = device.client.publish(f"ef/v1/cam-07/{channel}", b"left", qos=1, retain=True)
            info.wait_for_publish(20)
        cloud_pw = (folder / "cloud.secret").read_text().strip()
        assert _retained(port, cloud_pw, "ef/v1/cam-07/+") == 2
        # and when it is revoked, its connection is cut at once and stays cut
        revoked = fleet_cli("revoke", "cam-07")
        assert revoked.exit_code == 0, revoked.output
        assert device.disconnected.wait(20)
        device.close()
        # and nothing it retained is left to replay (#32)
        assert _retained(port, cloud_pw, "ef/v1/cam-07/+") == 0
        broker.restart()  # the file agrees with what was applied live
        again = Client(port, "cam-07", secrets["broker_password"], "ef-edge-cam-07")
        assert again.connect() not in (0, -1)
        again.close()
        # and an enrollment the broker refuses leaves nothing behind
        (folder / "admin.secret").write_text("not-the-admin-password\n")
        refused = fleet_cli("enroll", "cam-08")
        assert refused.exit_code == 2 and "refused" in refused.output
        assert not (tmp_path / "bundles" / "cam-08").exists()
        assert "cam-08" not in (folder / "dynamic-security.json").read_text()
    finally:
        broker.kill()


def test_a_cloud_whose_subscriptions_are_refused_is_not_ready(tmp_path: Path, caplog) -> None:
    from edgefleet.cloud.services import CloudServices
    from edgefleet.cloud.settings import CloudSettings
    from tests.support.waiting import eventually

    db = Database.connect(f"sqlite:///{tmp_path}/fleet.db")
    registry = DeviceRegistry(db)
    cam = registry.enroll("cam-01")
    broker = fleet_broker(registry, tmp_path / "broker")
    # given a cloud misconfigured with a device's account (it may not join the share group)
    settings = CloudSettings(
        data_dir=tmp_path / "cloud",
        mqtt={"port": broker.port, "username": "cam-01", "password": cam.broker_password},
        ingest={"client_id": device_client_id("cam-01")},
        models={"preload": False},
    )
    services = CloudServices.build(settings)
    try:
        services.start()
        # then it says why and stays not ready, instead of serving while ingesting nothing
        eventually(lambda: "refused the ingest subscriptions" in caplog.text, 30)
        ready, body = services.readiness()
        assert not ready and "broker not connected" in body["reasons"]
    finally:
        services.close()
        broker.kill()
        db.close()


def test_the_broker_holds_bounded_bytes_for_an_absent_cloud(tmp_path: Path) -> None:
    # #32: with `max_queued_bytes 0` one device could make the broker hold 100,000 x 8 MiB
    from edgefleet.fleet.acl import BrokerListener, write_broker_files
    from tests.support.broker import MosquittoBroker, free_port

    db = Database.connect(f"sqlite:///{tmp_path}/fleet.db")
    registry = DeviceRegistry(db)
    cam = registry.enroll("cam-01")
    cloud_password = registry.accounts.ensure_service("cloud")
    port = free_port()
    listener = BrokerListener(port, "127.0.0.1", max_queued_bytes=4 * 2**20)
    files = write_broker_files(registry, tmp_path / "broker", listener)
    broker = MosquittoBroker(files.folder, port, generated=files.config_file).start()
    try:
        # given the cloud's persistent session, subscribed, and the cloud away
        cloud = Client(port, "cloud", cloud_password, "cloud-q")
        assert cloud.connect(clean_start=False) == 0
        assert cloud.subscribe("ef/v1/+/telemetry") == [1]
        cloud.close()
        # when a device sends 10 MiB for it, each acknowledged
        device = Client(port, "cam-01", cam.broker_password, device_client_id("cam-01"))
        assert device.connect() == 0
        for _ in range(10):
            assert device.publish("ef/v1/cam-01/telemetry", b"x" * 2**20) in (0, NO_SUBSCRIBERS)
        # then the cloud, back, is handed what fits in the bound, not all of it
        back = Client(port, "cloud", cloud_password, "cloud-q")
        assert back.connect(clean_start=False) == 0
        assert device.publish("ef/v1/cam-01/telemetry", b"marker") == 0
        got: list[bytes] = []
        while not got or got[-1] != b"marker":
            got.append(back.received.get(timeout=20).payload)
        assert 1 <= len(got) - 1 <= 5, f"{len(got) - 1} of 10 MiB-messages held for the cloud"
        back.close()
        device.close()
    finally:
        broker.kill()
        db.close()
