"""Rendering of the broker configuration (the real broker enforces it in the integration tests)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from edgefleet.fleet.acl import (
    BrokerListener,
    emqx_users,
    render_dynsec,
    render_emqx_acl,
    render_mosquitto_conf,
    write_broker_files,
    write_emqx_files,
    write_private,
)
from edgefleet.fleet.credentials import mosquitto_hash, parse_mosquitto_hash
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.shared.db import Database
from edgefleet.shared.errors import ConfigError


def _acls(state: dict, role: str) -> list[tuple[str, str]]:
    [found] = [r for r in state["roles"] if r["rolename"] == role]
    return [(a["acltype"], a["topic"]) for a in found["acls"]]


def test_device_role_grants_exactly_the_contract_on_publish_and_subscribe() -> None:
    state = render_dynsec([("cam-01", mosquitto_hash("pw"))], [("cloud", mosquitto_hash("c"))])
    assert _acls(state, "ef-device-cam-01") == [
        ("publishClientSend", "ef/v1/cam-01/status"),
        ("publishClientSend", "ef/v1/cam-01/telemetry"),
        ("publishClientSend", "ef/v1/cam-01/escalations"),
        ("publishClientSend", "ef/v1/cam-01/reported"),
        ("subscribeLiteral", "ef/v1/cam-01/results"),
        ("publishClientReceive", "ef/v1/cam-01/results"),
        ("subscribeLiteral", "ef/v1/cam-01/desired"),
        ("publishClientReceive", "ef/v1/cam-01/desired"),
    ]
    # everything else is denied by default, subscriptions included
    assert state["defaultACLAccess"] == {
        "publishClientSend": False,
        "publishClientReceive": False,
        "subscribe": False,
        "unsubscribe": True,
    }
    # the cloud may join share groups and write results/desired, nothing else
    assert ("subscribePattern", "$share/+/ef/v1/#") in _acls(state, "cloud")
    assert ("publishClientSend", "ef/v1/+/results") in _acls(state, "cloud")
    sends = [t for kind, t in _acls(state, "cloud") if kind == "publishClientSend"]
    assert sends == ["ef/v1/+/results", "ef/v1/+/desired"]


def test_device_client_is_bound_to_its_client_id_with_the_same_pbkdf2_digest() -> None:
    encoded = mosquitto_hash("pw")
    state = render_dynsec([("cam-01", encoded)], [])
    [client] = state["clients"]
    assert client["username"] == "cam-01" and client["clientid"] == "ef-edge-cam-01"
    _, salt, digest = parse_mosquitto_hash(encoded)
    assert base64.b64decode(client["salt"]) == salt and len(salt) == 12
    expected = hashlib.pbkdf2_hmac("sha512", b"pw", salt, client["iterations"], 64)
    assert base64.b64decode(client["password"]) == expected == digest


def test_unknown_service_account_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown service account"):
        render_dynsec([], [("intruder", mosquitto_hash("x"))])


def test_mosquitto_conf_is_complete(tmp_path: Path) -> None:
    plugin = tmp_path / "dynsec.so"
    plugin.write_bytes(b"\x7fELF")
    conf = render_mosquitto_conf(tmp_path, BrokerListener(1999, "127.0.0.1", plugin, "edge"))
    lines = conf.splitlines()
    assert "listener 1999 127.0.0.1" in lines and "allow_anonymous false" in lines
    assert f"plugin {plugin}" in lines and "user edge" in lines
    assert f"plugin_opt_config_file {tmp_path / 'dynamic-security.json'}" in lines
    assert not [line for line in lines if line.startswith(("acl_file", "password_file"))]


def test_emqx_export_carries_the_same_digests_and_binds_client_ids() -> None:
    encoded = mosquitto_hash("pw")
    [user] = emqx_users([("cam-01", encoded)])
    _, salt, digest = parse_mosquitto_hash(encoded)
    assert user["user_id"] == "cam-01" and user["is_superuser"] is False
    assert user["salt"].encode() == salt and user["password_hash"] == digest.hex()
    acl = render_emqx_acl(["cam-01"], ["cloud", "ef-admin"])
    assert (
        '{allow, {\'and\', [{username, "cam-01"}, {clientid, "ef-edge-cam-01"}]}, subscribe, '
        '[{eq, "ef/v1/cam-01/results"}, {eq, "ef/v1/cam-01/desired"}]}.'
    ) in acl
    assert "ef-admin" not in acl and acl.strip().endswith("{deny, all}.")


def _registry(tmp_path: Path) -> DeviceRegistry:
    registry = DeviceRegistry(Database.connect(f"sqlite:///{tmp_path}/f.db"))
    registry.enroll("cam-01")
    registry.accounts.ensure_service("cloud")
    return registry


def test_files_are_written_private_from_the_registry(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    files = write_broker_files(registry, tmp_path / "out")
    write_emqx_files(registry, tmp_path / "out")
    assert stat.S_IMODE(files.folder.stat().st_mode) == 0o700
    for path in (files.config_file, files.dynsec_file, tmp_path / "out" / "emqx-users.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    state = json.loads(files.dynsec_file.read_text())
    assert [c["username"] for c in state["clients"]] == ["cloud", "cam-01"]
    registry.db.close()


def test_folder_can_be_shared_with_the_broker_group(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    gid = os.getgid()  # a group the writer may always give files to
    # when written for a broker that runs as another user in that group
    files = write_broker_files(registry, tmp_path / "out", readable_by_gid=gid)
    # then the plugin, which writes its state back, may write the folder and the file
    assert stat.S_IMODE(files.folder.stat().st_mode) == 0o770
    assert stat.S_IMODE(files.dynsec_file.stat().st_mode) == 0o660
    # and a later rewrite (enroll, revoke) keeps the broker's access
    registry.enroll("cam-02")
    write_broker_files(registry, tmp_path / "out")
    assert "cam-02" in files.dynsec_file.read_text()
    assert stat.S_IMODE(files.dynsec_file.stat().st_mode) == 0o660
    # and a fresh folder stays private by default
    other = write_broker_files(registry, tmp_path / "private")
    assert stat.S_IMODE(other.dynsec_file.stat().st_mode) == 0o600
    registry.db.close()


def test_secrets_are_never_written_world_readable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="others"):
        write_private(tmp_path / "passwords", "x\n", mode=0o644)
    with pytest.raises(ConfigError):
        write_private(tmp_path / "passwords", "x\n", mode=0o606)
    assert list(tmp_path.iterdir()) == []
