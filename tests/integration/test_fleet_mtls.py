"""Mutual TLS: a real Mosquitto listener requiring certificates issued by the fleet CA."""

from __future__ import annotations

import os
import queue
import ssl
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from fleet.acl import mosquitto_auth_config, reload_mosquitto, write_mosquitto_files
from fleet.ca import DeviceCA, mosquitto_tls_listener
from fleet.registry import DeviceRegistry
from shared.db import Database
from tests.support.broker import MosquittoBroker, free_port
from tests.support.fleet import wait_until


def tls_connect(port: int, ca: Path, cert: Path | None, key: Path | None) -> int:
    """CONNACK reason code of a TLS connection, or -1 if TLS or the connection failed."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="tls", protocol=mqtt.MQTTv5)
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
    registry.enroll("cam-01")
    registry.enroll("cam-02")
    files = write_mosquitto_files(registry, tmp_path / "auth")
    ca = DeviceCA(tmp_path / "ca")
    ca.init()
    server_cert, server_key = ca.issue_server(["127.0.0.1", "localhost"], tmp_path / "server")
    tls_port = free_port()
    pid_file = tmp_path / "broker.pid"
    extra = (
        mosquitto_auth_config(files)
        + f"pid_file {pid_file}\n"
        + ("user root\n" if os.geteuid() == 0 else "")
        + mosquitto_tls_listener(tls_port, ca, server_cert, server_key, bind="127.0.0.1")
    )
    broker = MosquittoBroker(tmp_path / "broker", extra_config=extra).start()
    yield ca, tls_port, tmp_path, pid_file
    broker.kill()
    db.close()


def test_device_certificate_required_and_revocable(tls_broker) -> None:
    ca, port, tmp_path, pid_file = tls_broker
    cert, key = ca.issue_device("cam-01", tmp_path / "devices")
    # a device with its certificate connects (its CN becomes its username)
    assert tls_connect(port, ca.cert_path, cert, key) == 0
    # without a client certificate the handshake is refused
    assert tls_connect(port, ca.cert_path, None, None) != 0
    # a certificate from another CA is refused
    rogue = DeviceCA(tmp_path / "rogue")
    rogue.init()
    rcert, rkey = rogue.issue_device("cam-01", tmp_path / "rogue-devices")
    assert tls_connect(port, ca.cert_path, rcert, rkey) != 0
    # after revocation (CRL rewritten, broker reloaded) the device's certificate is refused
    ca.revoke("cam-01")
    reload_mosquitto(pid_file)
    assert wait_until(lambda: tls_connect(port, ca.cert_path, cert, key) != 0, timeout_s=30)
