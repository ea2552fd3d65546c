"""Rendering of the broker auth files (the real broker enforces them in the integration tests)."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import pytest

from fleet.acl import (
    emqx_users,
    render_emqx_acl,
    render_mosquitto_acl,
    render_password_file,
    write_emqx_files,
    write_mosquitto_files,
)
from fleet.credentials import mosquitto_hash, parse_mosquitto_hash
from fleet.registry import DeviceRegistry
from shared.db import Database
from shared.errors import ConfigError


def test_mosquitto_acl_grants_exactly_the_contract() -> None:
    acl = render_mosquitto_acl(["cam-01"], ["cloud"])
    device = acl[acl.index("user cam-01") :].strip().splitlines()
    assert device == [
        "user cam-01",
        "topic write ef/v1/cam-01/status",
        "topic write ef/v1/cam-01/telemetry",
        "topic write ef/v1/cam-01/escalations",
        "topic write ef/v1/cam-01/reported",
        "topic read ef/v1/cam-01/results",
        "topic read ef/v1/cam-01/desired",
    ]
    assert "topic write ef/v1/+/desired" in acl and "topic read ef/v1/#" in acl
    assert "pattern" not in acl  # explicit per-user rules only


def test_password_file_refuses_bad_entries() -> None:
    line = render_password_file([("cam-01", mosquitto_hash("pw"))])
    assert line.startswith("cam-01:$7$101$") and line.endswith("\n")
    with pytest.raises(ConfigError):
        render_password_file([("a:b", mosquitto_hash("pw"))])
    with pytest.raises(ValueError):
        render_password_file([("cam-01", "plaintext")])


def test_emqx_export_carries_the_same_pbkdf2_digests() -> None:
    encoded = mosquitto_hash("pw")
    [user] = emqx_users([("cam-01", encoded)])
    _, salt, digest = parse_mosquitto_hash(encoded)
    assert user["user_id"] == "cam-01" and user["is_superuser"] is False
    assert user["salt"].encode() == salt
    expected = hashlib.pbkdf2_hmac("sha512", b"pw", user["salt"].encode(), 101, 64)
    assert user["password_hash"] == expected.hex() == digest.hex()
    acl = render_emqx_acl(["cam-01"], ["cloud"])
    assert '{allow, {username, "cam-01"}, subscribe, ["ef/v1/cam-01/results", ' in acl
    assert acl.strip().endswith("{deny, all}.")


def test_files_are_written_private_from_the_registry(tmp_path: Path) -> None:
    db = Database.connect(f"sqlite:///{tmp_path}/f.db")
    registry = DeviceRegistry(db)
    registry.enroll("cam-01")
    registry.ensure_service_account("cloud")
    files = write_mosquitto_files(registry, tmp_path / "out")
    write_emqx_files(registry, tmp_path / "out")
    for path in (files.password_file, files.acl_file, tmp_path / "out" / "emqx-users.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    users = json.loads((tmp_path / "out" / "emqx-users.json").read_text())
    assert [u["user_id"] for u in users] == ["cloud", "cam-01"]
    assert files.password_file.read_text().count("\n") == 2
    db.close()


def test_files_can_be_made_readable_by_the_broker_group(tmp_path: Path) -> None:
    import os

    db = Database.connect(f"sqlite:///{tmp_path}/f.db")
    registry = DeviceRegistry(db)
    registry.enroll("cam-01")
    gid = os.getgid()  # a group the writer may always give files to
    # when written for a broker that runs as another user in that group
    files = write_mosquitto_files(registry, tmp_path / "out", readable_by_gid=gid)
    for path in (files.password_file, files.acl_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o640 and path.stat().st_gid == gid
    # then a later rewrite (enroll, revoke) keeps the broker's read access
    registry.enroll("cam-02")
    write_mosquitto_files(registry, tmp_path / "out")
    assert "cam-02" in files.acl_file.read_text()
    for path in (files.password_file, files.acl_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o640 and path.stat().st_gid == gid
    # and a fresh directory stays private by default
    other = write_mosquitto_files(registry, tmp_path / "private")
    assert stat.S_IMODE(other.password_file.stat().st_mode) == 0o600
    db.close()


def test_secrets_are_never_written_world_readable(tmp_path: Path) -> None:
    from fleet.acl import write_private

    with pytest.raises(ConfigError, match="others"):
        write_private(tmp_path / "passwords", "x\n", mode=0o644)
    with pytest.raises(ConfigError):
        write_private(tmp_path / "passwords", "x\n", mode=0o660)
    assert list(tmp_path.iterdir()) == []
