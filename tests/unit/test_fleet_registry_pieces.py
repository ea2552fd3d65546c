"""The device registry's pieces, each built through its own constructor on one SQLite file
(devices enrolled and revoked through a registry, as another process would): the keys, the
broker's accounts and the telemetry log."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from edgefleet.fleet.accounts import BrokerAccounts
from edgefleet.fleet.credentials import KeySealer, verify_mosquitto_hash
from edgefleet.fleet.keys import DeviceKeys
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.fleet.telemetry_log import TelemetryLog
from edgefleet.shared.db import Database
from edgefleet.shared.errors import NotFound
from edgefleet.shared.messages import DeviceTelemetry, EscalationCounters
from tests.support.clock import FakeClock


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database.connect(f"sqlite:///{tmp_path}/fleet.db")
    yield database
    database.close()


def telemetry(device: str, seq: int, ts: datetime) -> DeviceTelemetry:
    return DeviceTelemetry(
        device_id=device,
        ts=ts,
        seq=seq,
        uptime_s=seq,
        escalations=EscalationCounters(sent=seq, pending=0, dropped=0),
        outbox_depth=seq,
        cpu_pct=10,
        ram_used_mb=10,
    )


def test_keys_are_cached_until_another_process_changes_them(db: Database) -> None:
    other = DeviceRegistry(db)  # the `fleet` CLI, say
    first = other.enroll("cam-01")
    other.enroll("cam-02")
    clock = FakeClock()
    keys = DeviceKeys(db, KeySealer(None), cache_s=5, clock=clock)
    assert keys.load() == 2
    assert keys.get("cam-01") == first.device_key
    # when the other process revokes cam-01
    other.revoke("cam-01")
    # then the cached key still answers until the next look for changes, not after it
    assert keys.get("cam-01") == first.device_key
    clock.now += 5
    assert keys.get("cam-01") is None
    assert keys.get("cam-02") is not None and keys.get("cam-99") is None


def test_broker_accounts_list_active_devices_and_create_a_service_account_once(
    db: Database,
) -> None:
    registry = DeviceRegistry(db)
    enrolled = registry.enroll("cam-01")
    registry.enroll("cam-02")
    registry.revoke("cam-02")
    accounts = BrokerAccounts(db)
    [(username, encoded)] = accounts.devices()
    assert username == "cam-01" and verify_mosquitto_hash(enrolled.broker_password, encoded)
    password = accounts.ensure_service("cloud")
    assert password is not None and accounts.ensure_service("cloud") is None
    [(service, hashed)] = accounts.services()
    assert service == "cloud" and verify_mosquitto_hash(password, hashed)


def test_the_telemetry_log_keeps_the_newest_and_a_bucketed_history(db: Database) -> None:
    DeviceRegistry(db).enroll("cam-01")
    log = TelemetryLog(db, bucket_s=60, retention_s=3600)
    t0 = datetime.now(timezone.utc).replace(second=0, microsecond=0) - timedelta(minutes=10)
    # a newer message, then an older one arriving late (a redelivery)
    log.record([telemetry("cam-01", 2, t0 + timedelta(seconds=70))])
    log.record([telemetry("cam-01", 1, t0 + timedelta(seconds=10))])
    row = db.query_one("SELECT telemetry_ts, outbox_depth FROM fleet_devices")
    assert row is not None and row["outbox_depth"] == 2  # the late one did not replace it
    # both fill their own bucket
    assert [p.outbox_depth for p in log.history("cam-01", hours=1)] == [1, 2]
    with pytest.raises(NotFound):
        log.record([telemetry("cam-99", 1, t0)])
    with pytest.raises(NotFound):
        log.history("cam-99")
    # a sample past the retention is pruned
    log.record([telemetry("cam-01", 3, t0 - timedelta(hours=2))])
    assert log.prune() == 1
    assert len(log.history("cam-01", hours=3)) == 2
