"""The device registry: who is enrolled, with which credentials, and how each device is doing.

It lives in the cloud's store (`edgefleet.shared.db.Database`, SQLite or PostgreSQL) so every
orchestrator replica sees the same fleet. Secrets are kept as `edgefleet.fleet.credentials` says:
hashes where only verification is needed, the sealed HMAC key where the cloud must sign
and verify with it. Its pieces: the keys (`DeviceKeys`, cached), the broker's accounts
(`BrokerAccounts`) and the telemetry (`TelemetryLog`, the last message and a history).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from typing import Any, Literal, TypeVar

from prometheus_client import Counter, Gauge

from edgefleet.fleet.accounts import BrokerAccounts
from edgefleet.fleet.credentials import (
    KeySealer,
    mosquitto_hash,
    new_device_key,
    new_password,
    new_token,
    token_digest,
)
from edgefleet.fleet.devices import (
    GROUP_PATTERN,
    RESERVED_NAMES,
    DeviceDetail,
    DeviceSummary,
    Enrollment,
    HistoryPoint,
    validate_device_id,
    validate_group,
)
from edgefleet.fleet.keys import DeviceKeys
from edgefleet.fleet.telemetry_log import SUMMARY_COLUMNS, TelemetryLog
from edgefleet.shared.db import Database
from edgefleet.shared.errors import Conflict, NotFound
from edgefleet.shared.gauges import observe
from edgefleet.shared.messages import (
    DesiredState,
    DeviceStatus,
    DeviceTelemetry,
    ReportedState,
    utcnow,
)

# The device models and id/group rules live in edgefleet.fleet.devices; they stay importable
# from here.
__all__ = [
    "DEVICES",
    "ENROLLED",
    "GROUP_PATTERN",
    "RESERVED_NAMES",
    "REVOKED",
    "DeviceDetail",
    "DeviceRegistry",
    "DeviceSummary",
    "Enrollment",
    "HistoryPoint",
    "validate_device_id",
    "validate_group",
]

log = logging.getLogger(__name__)

ENROLLED = Counter("ef_fleet_enrollments_total", "Devices enrolled")
REVOKED = Counter("ef_fleet_revocations_total", "Devices revoked")
DEVICES = Gauge("ef_fleet_devices", "Enrolled devices (read from the store when scraped)")
_State = TypeVar("_State", DesiredState, ReportedState)

_SCHEMA_V1 = [
    """CREATE TABLE IF NOT EXISTS fleet_devices (
        device_id TEXT PRIMARY KEY,
        grp TEXT NOT NULL,
        key_sealed TEXT,
        broker_hash TEXT,
        token_digest TEXT UNIQUE,
        enrolled_at {ts} NOT NULL,
        revoked_at {ts},
        online {bool} NOT NULL,
        agent_version TEXT,
        last_seen {ts},
        telemetry TEXT,
        reported TEXT,
        desired TEXT,
        fps {double}, latency_p95 {double}, cpu_pct {double},
        gpu_util {double}, gpu_temp {double}, gpu_power {double},
        outbox_depth {bigint}, escalations_sent {bigint}, escalation_rate {double},
        agreement {double},
        updated_at {ts} NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS fleet_devices_grp ON fleet_devices (grp)",
    "CREATE INDEX IF NOT EXISTS fleet_devices_updated ON fleet_devices (updated_at)",
    """CREATE TABLE IF NOT EXISTS fleet_telemetry_history (
        device_id TEXT NOT NULL,
        bucket {bigint} NOT NULL,
        fps {double}, latency_p95 {double}, cpu_pct {double},
        gpu_util {double}, gpu_temp {double}, gpu_power {double},
        outbox_depth {bigint}, escalation_rate {double}, agreement {double},
        PRIMARY KEY (device_id, bucket)
    )""",
    """CREATE TABLE IF NOT EXISTS fleet_service_accounts (
        username TEXT PRIMARY KEY,
        broker_hash TEXT NOT NULL,
        created_at {ts} NOT NULL
    )""",
]


class DeviceRegistry:
    """Enrollment, credentials and last known state of every device, in the cloud's store."""

    def __init__(
        self,
        db: Database,
        *,
        master_key: str | bytes | None = None,
        history_bucket_s: int = 60,
        history_retention_s: int = 24 * 3600,
        key_cache_s: float = 5.0,
        key_cache_entries: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ):
        _migrate(db)
        self.db = db
        self.sealer = KeySealer(master_key)
        self.keys = DeviceKeys(
            db, self.sealer, cache_s=key_cache_s, max_entries=key_cache_entries, clock=clock
        )
        self.accounts = BrokerAccounts(db)
        self.telemetry = TelemetryLog(
            db, bucket_s=history_bucket_s, retention_s=history_retention_s
        )
        # several registries of a process read one store: the count is the same, not a sum
        observe(DEVICES, self, _count_or_nan, combine=max)

    # --- enrollment and credentials ---------------------------------------------------

    def enroll(self, device_id: str, group: str = "default") -> Enrollment:
        """Create the device and its secrets; Conflict if it is enrolled already."""
        validate_device_id(device_id)
        validate_group(group)
        key, password, token = new_device_key(), new_password(), new_token()
        now = utcnow()
        with self.db.transaction():
            row = self.db.query_one(
                "SELECT revoked_at FROM fleet_devices WHERE device_id = ?", (device_id,)
            )
            if row is not None and row["revoked_at"] is None:
                raise Conflict(
                    f"device {device_id!r} is already enrolled",
                    hint="revoke it first (`edgefleet fleet revoke`) to issue new credentials",
                )
            if row is not None:
                self.db.execute("DELETE FROM fleet_devices WHERE device_id = ?", (device_id,))
            self.db.execute(
                "INSERT INTO fleet_devices (device_id, grp, key_sealed, broker_hash, "
                "token_digest, enrolled_at, online, updated_at, key_changed_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    device_id,
                    group,
                    self.sealer.seal(key),
                    mosquitto_hash(password),
                    token_digest(token),
                    now,
                    False,
                    now,
                    now,
                ),
            )
        self.keys.remember(device_id, key, now)
        ENROLLED.inc()
        log.info("enrolled device", extra={"device_id": device_id, "group": group})
        return Enrollment(device_id, group, key, password, token)

    def device_key(self, device_id: str) -> bytes | None:
        """The HMAC key of an enrolled, unrevoked device; None otherwise."""
        return self.keys.get(device_id)

    def authenticate_token(self, token: str) -> str | None:
        """The device id a REST bearer token belongs to, or None."""
        if not token or not token.startswith("eft_"):
            return None
        row = self.db.query_one(
            "SELECT device_id FROM fleet_devices WHERE token_digest = ? AND revoked_at IS NULL",
            (token_digest(token),),
        )
        return row["device_id"] if row else None

    def revoke(self, device_id: str) -> None:
        """Drop every credential of the device; NotFound if it is not enrolled."""
        now = utcnow()
        changed = self.db.execute(
            "UPDATE fleet_devices SET revoked_at = ?, key_sealed = NULL, broker_hash = NULL, "
            "token_digest = NULL, online = ?, updated_at = ?, key_changed_at = ? "
            "WHERE device_id = ? AND revoked_at IS NULL",
            (now, False, now, now, device_id),
        )
        self.keys.forget(device_id)
        if not changed:
            raise NotFound(f"device {device_id!r} is not enrolled")
        self.db.execute("DELETE FROM fleet_telemetry_history WHERE device_id = ?", (device_id,))
        REVOKED.inc()
        log.info("revoked device", extra={"device_id": device_id})

    # --- what devices tell us ---------------------------------------------------------

    def record_status(self, status: DeviceStatus) -> None:
        """`online` is news of now (heard now); `offline` may be the last will, signed when
        the device connected: it moves neither `last_seen` back nor `heard_at`."""
        last_seen = (
            "last_seen = CASE WHEN last_seen IS NULL OR last_seen < ? THEN ? ELSE last_seen END"
        )
        if status.state == "online":
            self._update(
                status.device_id,
                f"online = ?, agent_version = ?, {last_seen}, heard_at = ?",
                (True, status.agent_version, status.ts, status.ts, utcnow()),
            )
        else:
            self._update(
                status.device_id,
                f"online = ?, agent_version = ?, {last_seen}",
                (False, status.agent_version, status.ts, status.ts),
            )

    def mark_silent(self, heard_before: datetime) -> list[str]:
        """Mark offline the online devices not heard since `heard_before` (cloud clock):
        a device killed or cut off whose last will never came. Returns their ids."""
        rows = self.db.query(
            "SELECT device_id FROM fleet_devices WHERE online = ? AND revoked_at IS NULL "
            "AND (heard_at IS NULL OR heard_at < ?) ORDER BY device_id",
            (True, heard_before),
        )
        ids = [r["device_id"] for r in rows]
        if ids:
            self.db.execute_many(
                "UPDATE fleet_devices SET online = ?, updated_at = ? WHERE device_id = ? "
                "AND online = ? AND (heard_at IS NULL OR heard_at < ?)",
                [(False, utcnow(), device_id, True, heard_before) for device_id in ids],
            )
        return ids

    def record_telemetry(self, telemetry: DeviceTelemetry) -> None:
        """Keep the newest message in full plus one downsampled sample per history bucket."""
        self.record_telemetries([telemetry])

    def record_telemetries(self, batch: Sequence[DeviceTelemetry]) -> None:
        """Record several messages (see `TelemetryLog.record`)."""
        self.telemetry.record(batch)

    def batch(self) -> AbstractContextManager[object]:
        """One transaction for several records (the cloud stores telemetry in batches)."""
        return self.db.transaction()

    def record_reported(self, reported: ReportedState) -> None:
        self._update(
            reported.device_id,
            "reported = ?, last_seen = ?",
            (reported.model_dump_json(), utcnow()),
        )

    def set_desired(self, desired: DesiredState | None, device_id: str) -> None:
        """What the fleet last told the device to run (kept for rollbacks and the views)."""
        self._update(device_id, "desired = ?", (desired.model_dump_json() if desired else None,))

    def desired(self, device_id: str) -> DesiredState | None:
        return _stored(self.db, device_id, "desired", DesiredState)

    def reported(self, device_id: str) -> ReportedState | None:
        return _stored(self.db, device_id, "reported", ReportedState)

    # --- views ------------------------------------------------------------------------

    def list_devices(
        self, group: str | None = None, *, updated_since: datetime | None = None
    ) -> list[DeviceSummary]:
        where: list[str] = ["revoked_at IS NULL"]
        params: list[object] = []
        if group is not None:
            where.append("grp = ?")
            params.append(group)
        if updated_since is not None:
            where.append("updated_at > ?")
            params.append(updated_since)
        rows = self.db.query(
            f"SELECT * FROM fleet_devices WHERE {' AND '.join(where)} ORDER BY device_id",
            params,
        )
        return [_summary(r) for r in rows]

    def get_device(self, device_id: str) -> DeviceDetail:
        row = self.db.query_one(
            "SELECT * FROM fleet_devices WHERE device_id = ? AND revoked_at IS NULL", (device_id,)
        )
        if row is None:
            raise NotFound(f"device {device_id!r} is not enrolled")
        base = _summary(row).model_dump()
        return DeviceDetail(
            **base,
            telemetry=json.loads(row["telemetry"]) if row["telemetry"] else None,
            reported=json.loads(row["reported"]) if row["reported"] else None,
            desired=json.loads(row["desired"]) if row["desired"] else None,
        )

    def groups(self) -> list[str]:
        rows = self.db.query(
            "SELECT DISTINCT grp FROM fleet_devices WHERE revoked_at IS NULL ORDER BY grp"
        )
        return [r["grp"] for r in rows]

    def devices_in_group(self, group: str) -> list[str]:
        rows = self.db.query(
            "SELECT device_id FROM fleet_devices WHERE grp = ? AND revoked_at IS NULL "
            "ORDER BY device_id",
            (group,),
        )
        return [r["device_id"] for r in rows]

    def count(self) -> int:
        row = self.db.query_one("SELECT COUNT(*) AS n FROM fleet_devices WHERE revoked_at IS NULL")
        return int(row["n"]) if row else 0

    def _update(self, device_id: str, assignments: str, params: Sequence[Any]) -> None:
        changed = self.db.execute(
            f"UPDATE fleet_devices SET {assignments}, updated_at = ? "
            "WHERE device_id = ? AND revoked_at IS NULL",
            (*params, utcnow(), device_id),
        )
        if not changed:
            raise NotFound(f"device {device_id!r} is not enrolled")


def _migrate(db: Database) -> None:
    t = db.types
    db.migrate(
        "fleet_registry_v1",
        [
            s.format(ts=t.timestamp, bool=t.boolean, double=t.double, bigint=t.bigint)
            for s in _SCHEMA_V1
        ],
    )
    # the ts of the telemetry kept as the last: an older one arriving later (a redelivery
    # after a crash, an outbox backlog after an outage) must not replace it
    db.migrate(
        "fleet_registry_v2",
        [f"ALTER TABLE fleet_devices ADD COLUMN telemetry_ts {t.timestamp}"],
    )
    # when the device's key last changed (enrolled, revoked): what the key caches of
    # running replicas poll for
    db.migrate(
        "fleet_registry_v3",
        [
            f"ALTER TABLE fleet_devices ADD COLUMN key_changed_at {t.timestamp}",
            "CREATE INDEX IF NOT EXISTS fleet_devices_key_changed "
            "ON fleet_devices (key_changed_at)",
        ],
    )
    # when the cloud last heard the device alive, by the cloud's own clock: what
    # `mark_silent` compares, since a device's clock and its last will's ts are not news
    db.migrate(
        "fleet_registry_v4",
        [f"ALTER TABLE fleet_devices ADD COLUMN heard_at {t.timestamp}"],
    )


def _stored(
    db: Database, device_id: str, column: Literal["desired", "reported"], model: type[_State]
) -> _State | None:
    """The state message kept in `column` (revoked devices included), or None."""
    row = db.query_one(
        f"SELECT {column} FROM fleet_devices WHERE device_id = ?", (device_id,)
    )
    if row is None or not row[column]:
        return None
    return model.model_validate_json(row[column])


def _count_or_nan(registry: DeviceRegistry) -> float:
    """`ef_fleet_devices` read from the store when scraped: devices enrolled by the CLI
    (another process) count too; a store that does not answer reads as NaN."""
    try:
        return float(registry.count())
    except Exception:  # a scrape must never fail on the store
        return float("nan")


# what a device is doing now: not shown for an offline device (its last fps is not its fps)
LIVE_COLUMNS = ("fps", "latency_p95", "cpu_pct", "gpu_util", "gpu_power", "escalation_rate")


def _summary(row: dict[str, Any]) -> DeviceSummary:
    reported = json.loads(row["reported"]) if row.get("reported") else None
    desired = json.loads(row["desired"]) if row.get("desired") else None
    model = json.loads(row["telemetry"]).get("model") if row.get("telemetry") else None
    deployed = {
        m["name"]: f"{m['name']}@{m['version']}" for m in (reported or {}).get("models") or []
    }
    telemetry_model = None
    if model:
        telemetry_model = f"{model['name']}@{model['version']}"
        if reported and reported.get("status") == "healthy":
            # what the rollout installed: a model's own version, and a component swapped
            # into a pipeline (its detector, say), which still reports the pipeline's name
            telemetry_model = deployed.pop(model["name"], telemetry_model)
            if deployed:
                telemetry_model = f"{telemetry_model} + {', '.join(deployed.values())}"
    elif deployed:
        telemetry_model = ",".join(deployed.values())
    online = bool(row["online"])
    figures = {c: row[c] for c in SUMMARY_COLUMNS}
    offline_for_s = None
    if not online:
        figures.update(dict.fromkeys(LIVE_COLUMNS))
        since = row.get("heard_at") or row.get("last_seen")
        if since is not None:
            offline_for_s = max(0.0, (utcnow() - _aware(since)).total_seconds())
    return DeviceSummary(
        device_id=row["device_id"],
        group=row["grp"],
        online=online,
        offline_for_s=offline_for_s,
        agent_version=row["agent_version"],
        enrolled_at=row["enrolled_at"],
        last_seen=row["last_seen"],
        deployment_id=reported["deployment_id"] if reported else None,
        deployment_status=reported["status"] if reported else None,
        desired_deployment_id=desired["deployment_id"] if desired else None,
        running_image=reported.get("running_image") if reported else None,
        model=telemetry_model,
        updated_at=row["updated_at"],
        **figures,
    )


def _aware(ts: datetime) -> datetime:
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=timezone.utc)
