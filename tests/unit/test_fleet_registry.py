"""Device registry on a real SQLite file (and on the tests' PostgreSQL): secrets, state, history."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from edgefleet.fleet.credentials import KeySealer, mosquitto_hash, verify_mosquitto_hash
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.fleet.rollout import RolloutController
from edgefleet.shared.db import Database
from edgefleet.shared.errors import ConfigError, Conflict, InvalidInput, NotFound
from edgefleet.shared.messages import (
    DeviceStatus,
    DeviceTelemetry,
    EscalationCounters,
    ReportedState,
)
from tests.support.clock import FakeClock


def telemetry(device: str, seq: int, sent: int, ts: datetime) -> DeviceTelemetry:
    return DeviceTelemetry(
        device_id=device,
        ts=ts,
        seq=seq,
        uptime_s=seq,
        escalations=EscalationCounters(sent=sent, pending=0, dropped=0),
        outbox_depth=seq,
        cpu_pct=10,
        ram_used_mb=10,
    )


@pytest.fixture
def db(tmp_path: Path):
    database = Database.connect(f"sqlite:///{tmp_path}/fleet.db")
    yield database
    database.close()


def test_mosquitto_hash_is_what_mosquitto_passwd_writes() -> None:
    # a line `mosquitto_passwd -b pf u1 secret` wrote (mosquitto 2.0.11)
    known = (
        "$7$101$zM0LgIYisWu2ffq6$wR3Gw58X4w7MgMoCWDTZPjNu+bDXL3xBlhvjJVXUb4+cOlciAziyePvRa"
        "STzvkh4iKSvGwt204o2Occ0vHFLEQ=="
    )
    assert verify_mosquitto_hash("secret", known)
    assert not verify_mosquitto_hash("Secret", known)
    ours = mosquitto_hash("pw")
    assert ours.startswith("$7$101$") and verify_mosquitto_hash("pw", ours)


def test_enroll_issues_secrets_stored_only_as_needed(db: Database, tmp_path: Path) -> None:
    registry = DeviceRegistry(db)
    e = registry.enroll("cam-01", group="dock")
    assert len(e.device_key) == 32 and e.token.startswith("eft_")
    assert registry.device_key("cam-01") == e.device_key
    assert registry.authenticate_token(e.token) == "cam-01"
    assert registry.authenticate_token(e.token + "x") is None
    assert registry.authenticate_token("") is None
    raw = (tmp_path / "fleet.db").read_bytes()
    assert e.token.encode() not in raw and e.broker_password.encode() not in raw
    (username, encoded) = registry.accounts.devices()[0]
    assert username == "cam-01" and verify_mosquitto_hash(e.broker_password, encoded)
    with pytest.raises(Conflict):
        registry.enroll("cam-01")
    for bad in ("Cam-01", "-x", "a" * 64, "cloud"):
        with pytest.raises(InvalidInput):
            registry.enroll(bad)
    with pytest.raises(InvalidInput):
        registry.enroll("cam-02", group="Bad Group")


def test_master_key_seals_device_keys(db: Database, tmp_path: Path) -> None:
    master = KeySealer.generate_master_key()
    registry = DeviceRegistry(db, master_key=master)
    e = registry.enroll("cam-01")
    assert e.device_key.hex().encode() not in (tmp_path / "fleet.db").read_bytes()
    # a second process with the same master key reads it back
    assert DeviceRegistry(db, master_key=master).device_key("cam-01") == e.device_key
    with pytest.raises(ConfigError):
        DeviceRegistry(db, master_key=KeySealer.generate_master_key()).device_key("cam-01")
    with pytest.raises(ConfigError):
        DeviceRegistry(db).device_key("cam-01")
    with pytest.raises(ConfigError):
        DeviceRegistry(db, master_key="not a fernet key")


def test_revoke_removes_every_credential(db: Database) -> None:
    registry = DeviceRegistry(db)
    e = registry.enroll("cam-01")
    registry.revoke("cam-01")
    assert registry.device_key("cam-01") is None
    assert registry.authenticate_token(e.token) is None
    assert registry.accounts.devices() == [] and registry.list_devices() == []
    with pytest.raises(NotFound):
        registry.revoke("cam-01")
    with pytest.raises(NotFound):
        registry.record_status(DeviceStatus(device_id="cam-01", state="online", agent_version="1"))
    # the id may be enrolled again, with new secrets
    again = registry.enroll("cam-01")
    assert again.device_key != e.device_key


def test_state_views_and_downsampled_history(db: Database) -> None:
    registry = DeviceRegistry(db, history_bucket_s=60)
    registry.enroll("cam-01", group="a")
    registry.enroll("cam-02", group="b")
    registry.record_status(DeviceStatus(device_id="cam-01", state="online", agent_version="0.9"))
    t0 = datetime.now(timezone.utc).replace(second=0, microsecond=0) - timedelta(minutes=10)
    # two samples in one minute bucket, one in the next
    registry.record_telemetry(telemetry("cam-01", 1, sent=10, ts=t0 + timedelta(seconds=1)))
    registry.record_telemetry(telemetry("cam-01", 2, sent=16, ts=t0 + timedelta(seconds=31)))
    registry.record_telemetry(telemetry("cam-01", 3, sent=16, ts=t0 + timedelta(seconds=61)))
    points = registry.telemetry.history("cam-01", hours=1)
    assert [p.outbox_depth for p in points] == [2, 3]
    assert points[0].escalation_rate == pytest.approx(12.0)  # 6 in 30 s
    detail = registry.get_device("cam-01")
    assert detail.online and detail.agent_version == "0.9" and detail.telemetry["seq"] == 3
    running = "r.example/e@sha256:" + "e" * 64
    registry.record_reported(
        ReportedState(
            device_id="cam-01",
            deployment_id="dep-1",
            image=running,
            status="healthy",
            running_image=running,
        )
    )
    summary = registry.list_devices("a")[0]
    assert summary.deployment_id == "dep-1" and summary.deployment_status == "healthy"
    assert summary.running_image == running  # the digest the dashboard shows
    assert [d.device_id for d in registry.list_devices()] == ["cam-01", "cam-02"]
    assert registry.groups() == ["a", "b"]
    with pytest.raises(NotFound):
        registry.get_device("cam-09")
    with pytest.raises(NotFound):
        registry.record_telemetry(telemetry("cam-09", 1, 0, datetime.now(timezone.utc)))


def test_telemetry_arriving_late_or_twice_never_replaces_the_newest(db: Database) -> None:
    # given a device whose telemetry of 12:00:30 is stored (with a rate from 12:00:00)
    registry = DeviceRegistry(db, history_bucket_s=10)
    registry.enroll("cam-01")
    t0 = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=5)
    registry.record_telemetry(telemetry("cam-01", 1, sent=0, ts=t0))
    registry.record_telemetry(telemetry("cam-01", 4, sent=6, ts=t0 + timedelta(seconds=30)))
    # when an older message arrives late (a redelivery after a crash, an outbox backlog)
    registry.record_telemetry(telemetry("cam-01", 2, sent=2, ts=t0 + timedelta(seconds=10)))
    # and the newest one arrives a second time
    registry.record_telemetry(telemetry("cam-01", 4, sent=6, ts=t0 + timedelta(seconds=30)))
    # then the newest stays the device's telemetry, its rate intact
    detail = registry.get_device("cam-01")
    assert detail.telemetry is not None and detail.telemetry["seq"] == 4
    points = registry.telemetry.history("cam-01", hours=1)
    # and the late one still fills its own history bucket, once
    assert [p.outbox_depth for p in points] == [1, 2, 4]
    assert points[-1].escalation_rate == pytest.approx(12.0)  # 6 in 30 s


def test_postgres_store(pg_url: str) -> None:
    """The scale path: the same registry and rollout tables on PostgreSQL, in a fresh schema."""
    db = Database.connect(pg_url)
    try:
        registry = DeviceRegistry(db)
        for i in range(3):
            registry.enroll(f"cam-{i}", group="pg")
        now = datetime.now(timezone.utc)
        registry.record_telemetry(telemetry("cam-1", 1, 1, now))
        registry.record_telemetry(telemetry("cam-1", 2, 2, now))  # same bucket: upsert
        assert len(registry.telemetry.history("cam-1")) == 1
        sent = []
        rollouts = RolloutController(
            registry, db, lambda w, r: sent.append(w), tick_interval_s=None
        )
        dep = rollouts.create(
            {
                "group": "pg",
                "image": "edge:1",
                "models": [{"name": "m", "version": "1", "url": "http://x", "sha256": "a" * 64}],
                "soak_s": 0,
            }
        )
        with pytest.raises(Conflict):
            rollouts.create({"group": "pg", "image": "edge:2"})
        rollouts.on_reported(
            ReportedState(
                device_id=dep.canaries[0],
                deployment_id=dep.id,
                image="edge:1",
                status="healthy",
                running_image="edge:1",
            )
        )
        assert rollouts.get(dep.id).status == "rolling" and len(sent) == 3
    finally:
        db.close()


def test_revoke_and_re_enroll_by_another_process_reach_a_running_cloud(tmp_path: Path) -> None:
    from tests.support.waiting import eventually

    url = f"sqlite:///{tmp_path}/shared.db"
    # given a cloud's registry that has used cam-01's key (and cached it)
    cloud = DeviceRegistry(Database.connect(url), key_cache_s=0.2)
    cli = DeviceRegistry(Database.connect(url))  # `edgefleet fleet ...`, another process
    old = cli.enroll("cam-01").device_key
    assert cloud.device_key("cam-01") == old
    # when the fleet CLI revokes it, the cloud refuses the old key within its cache time
    cli.revoke("cam-01")
    eventually(lambda: cloud.device_key("cam-01") is None, timeout_s=10)
    # and when it is enrolled again, the cloud takes the new key, never the old one
    new = cli.enroll("cam-01").device_key
    eventually(lambda: cloud.device_key("cam-01") == new, timeout_s=10)
    assert new != old


def test_a_replica_reads_device_keys_in_one_query_and_keeps_them_until_they_change(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/shared.db"
    cli = DeviceRegistry(Database.connect(url))  # `edgefleet fleet enroll`, another process
    keys = {f"cam-{i}": cli.enroll(f"cam-{i}").device_key for i in range(5)}
    # given a replica that loaded the keys at start and checks for changes every 5 s
    clock = FakeClock()
    cloud = DeviceRegistry(Database.connect(url), key_cache_s=5.0, clock=clock)
    assert cloud.keys.load() == 5
    single_reads = []
    query_one = cloud.db.query_one
    cloud.db.query_one = lambda *a, **k: single_reads.append(a) or query_one(*a, **k)  # type: ignore[method-assign]
    # when each device's messages arrive over several checks
    for _ in range(3):
        clock.now += 6.0
        for device_id, key in keys.items():
            assert cloud.device_key(device_id) == key
    # then no key was read alone from the store
    assert single_reads == []
    # and a revoke by another process is seen at the next check
    cli.revoke("cam-3")
    assert cloud.device_key("cam-3") == keys["cam-3"]  # cached until the next check
    clock.now += 6.0
    assert cloud.device_key("cam-3") is None and cloud.device_key("cam-1") == keys["cam-1"]


def test_a_component_swapped_into_a_pipeline_is_shown_beside_it(db: Database) -> None:
    from edgefleet.shared.messages import ModelInfo, ModelRef

    # given a device whose telemetry names its OCR pipeline
    registry = DeviceRegistry(db)
    registry.enroll("cam-1", group="dock")
    running = telemetry("cam-1", 1, 0, datetime.now(timezone.utc)).model_copy(
        update={"model": ModelInfo(name="ppocr6-tiny", version="6.0")}
    )
    registry.record_telemetry(running)
    assert registry.get_device("cam-1").model == "ppocr6-tiny@6.0"
    # when a rollout swaps its detector in and the device reports healthy
    det = ModelRef(name="ppocr6-tiny-det", version="6.1", url="http://x", sha256="a" * 64)
    for status in ("applying", "healthy"):
        registry.record_reported(
            ReportedState(
                device_id="cam-1", deployment_id="dep-1", image="edge:1",
                models=[det], status=status,  # type: ignore[arg-type]
            )
        )  # fmt: skip
    # then the device's model names the component it now runs
    shown = registry.get_device("cam-1").model
    assert shown == "ppocr6-tiny@6.0 + ppocr6-tiny-det@6.1"
    assert [d.model for d in registry.list_devices()] == [shown]


def test_a_swapped_model_is_shown_at_the_version_the_rollout_installed(db: Database) -> None:
    from edgefleet.shared.messages import ModelInfo, ModelRef

    # given a device whose model reports the version in its manifest entry
    registry = DeviceRegistry(db)
    registry.enroll("cam-2", group="dock")
    running = telemetry("cam-2", 1, 0, datetime.now(timezone.utc)).model_copy(
        update={"model": ModelInfo(name="det", version="1")}
    )
    registry.record_telemetry(running)
    # when a rollout swaps det@3 in and the device reports healthy
    det = ModelRef(name="det", version="3", url="http://x", sha256="b" * 64)
    registry.record_reported(
        ReportedState(
            device_id="cam-2", deployment_id="dep-2", image="edge:1", models=[det], status="healthy"
        )
    )
    # then it is shown as det@3
    assert registry.get_device("cam-2").model == "det@3"
