"""Mutual TLS: a real Mosquitto listener requiring certificates issued by the fleet CA."""

from __future__ import annotations

import queue
import ssl
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from edgefleet.fleet.acl import reload_broker
from edgefleet.fleet.ca import DeviceCA, mosquitto_tls_listener
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.shared.db import Database
from edgefleet.shared.mqtt import device_client_id
from tests.support.broker import free_port, wait_for_port
from tests.support.fleet import fleet_broker
from tests.support.waiting import eventually


def tls_connect(
    port: int,
    ca: Path,
    cert: Path | None,
    key: Path | None,
    login: tuple[str, str] | None = None,
    client_id: str = "tls",
) -> int:
    """CONNACK reason code of a TLS connection, or -1 if TLS or the connection failed."""
    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
    )
    if login is not None:
        client.username_pw_set(*login)
    client.tls_set(
        ca_certs=str(ca),
        certfile=str(cert) if cert else None,
        keyfile=str(key) if key else None,
        tls_version=ssl.PROTOCOL_TLS_CLIENT,
    )
    result: queue.Queue[int] = queue.Queue()
    client.on_connect = lambda c, u, f, rc, p: result.put(rc.value)
    client.on_connect_fail = lambda c, u: result.put(-1)
    client.on_disconnect = lambda c, u, f, rc, p: result.put(-1)
    try:
        client.connect("127.0.0.1", port)
    except (OSError, ssl.SSLError):
        return -1
    client.loop_start()
    try:
        return result.get(timeout=20)
    except queue.Empty:
        return -1
    finally:
        client.disconnect()
        client.loop_stop()


@pytest.fixture
def tls_broker(tmp_path: Path):
    db = Database.connect(f"sqlite:///{tmp_path}/fleet.db")
    registry = DeviceRegistry(db)
    enrollments = {d: registry.enroll(d) for d in ("cam-01", "cam-02")}
    ca = DeviceCA(tmp_path / "ca")
    ca.init()
    server_cert, server_key = ca.issue_server(["127.0.0.1", "localhost"], tmp_path / "server")
    tls_port = free_port()
    # the listener block `fleet ca-broker` prints, dropped into the broker folder's conf.d
    (tmp_path / "broker" / "conf.d").mkdir(parents=True)
    (tmp_path / "broker" / "conf.d" / "tls.conf").write_text(
        mosquitto_tls_listener(tls_port, ca, server_cert, server_key, bind="127.0.0.1")
    )
    broker = fleet_broker(registry, tmp_path / "broker")
    wait_for_port(tls_port)
    yield ca, tls_port, tmp_path, enrollments
    broker.kill()
    db.close()


def test_device_certificate_and_password_required_and_revocable(tls_broker) -> None:
    ca, port, tmp_path, enrollments = tls_broker
    cert, key = ca.issue_device("cam-01", tmp_path / "devices")
    login = ("cam-01", enrollments["cam-01"].broker_password)
    own_id = device_client_id("cam-01")
    # a device with its certificate and its login connects
    assert tls_connect(port, ca.cert_path, cert, key, login, own_id) == 0
    # the certificate alone is not enough, nor another client id (the plugin binds them)
    assert tls_connect(port, ca.cert_path, cert, key, None, own_id) not in (0, -1)
    assert tls_connect(port, ca.cert_path, cert, key, login, "ef-edge-cam-02") not in (0, -1)
    # without a client certificate the handshake is refused
    assert tls_connect(port, ca.cert_path, None, None, login, own_id) != 0
    # a certificate from another CA is refused
    rogue = DeviceCA(tmp_path / "rogue")
    rogue.init()
    rcert, rkey = rogue.issue_device("cam-01", tmp_path / "rogue-devices")
    assert tls_connect(port, ca.cert_path, rcert, rkey, login, own_id) != 0
    # after revocation (CRL rewritten, broker reloaded) the device's certificate is refused
    ca.revoke("cam-01")
    assert reload_broker(tmp_path / "broker") is not None
    eventually(lambda: tls_connect(port, ca.cert_path, cert, key, login, own_id) != 0, timeout_s=30)
