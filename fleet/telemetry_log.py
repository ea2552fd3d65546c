"""Device telemetry, kept twice: the last message in full on the device's row (for the
device view) and a downsampled history, one sample per device per bucket (for the charts).

Recording is idempotent and order-proof: a message older than (or the same as) the one kept
changes nothing already stored, only fills its history bucket if that is empty.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from prometheus_client import Counter

from edgefleet.fleet.devices import HistoryPoint
from edgefleet.shared.db import Database
from edgefleet.shared.errors import NotFound
from edgefleet.shared.messages import DeviceTelemetry, utcnow

TELEMETRY_RECORDED = Counter("ef_fleet_telemetry_recorded_total", "Telemetry messages stored")

SUMMARY_COLUMNS = (
    "fps",
    "latency_p95",
    "cpu_pct",
    "gpu_util",
    "gpu_temp",
    "gpu_power",
    "outbox_depth",
    "escalation_rate",
    "agreement",
)


class TelemetryLog:
    def __init__(self, db: Database, *, bucket_s: int = 60, retention_s: int = 24 * 3600):
        self.db = db
        self.bucket_s = bucket_s
        self.retention_s = retention_s
        self._lock = threading.Lock()
        self._writes = 0

    def record(self, batch: Sequence[DeviceTelemetry]) -> None:
        """Record several messages as if one by one in ts order, in three statements;
        NotFound (and nothing written) if one device is not enrolled."""
        if not batch:
            return
        ordered = sorted(batch, key=lambda t: (t.device_id, t.ts))
        ids = sorted({t.device_id for t in ordered})
        # rows locked in one order (device id) by every replica: no crosswise waits
        lock = " FOR UPDATE" if self.db.dialect == "postgresql" else ""
        rows = self.db.query(
            "SELECT device_id, escalations_sent, last_seen, telemetry_ts FROM fleet_devices "
            f"WHERE device_id IN ({', '.join('?' for _ in ids)}) AND revoked_at IS NULL "
            f"ORDER BY device_id{lock}",
            ids,
        )
        state = {r["device_id"]: r for r in rows}
        missing = [d for d in ids if d not in state]
        if missing:
            raise NotFound(f"device {missing[0]!r} is not enrolled")
        newest: dict[str, tuple[Any, ...]] = {}
        fresh, late = [], []
        for t in ordered:
            prev = state[t.device_id]
            summary = _summarise(t)
            summary["escalation_rate"] = _escalation_rate(t, prev)
            values = tuple(summary[c] for c in SUMMARY_COLUMNS)
            bucket = int(t.ts.timestamp()) // self.bucket_s * self.bucket_s
            if prev["telemetry_ts"] is None or prev["telemetry_ts"] < t.ts:
                sent = t.escalations.sent
                newest[t.device_id] = (t.model_dump_json(), t.ts, sent, t.ts, True, *values)
                state[t.device_id] = {
                    "escalations_sent": sent,
                    "last_seen": t.ts,
                    "telemetry_ts": t.ts,
                }
                fresh.append((t.device_id, bucket, *values))
            else:
                late.append((t.device_id, bucket, *values))
        sets = ", ".join(f"{c} = ?" for c in SUMMARY_COLUMNS)
        now = utcnow()
        self.db.execute_many(  # the guard again in SQL: another replica may be ahead
            f"UPDATE fleet_devices SET telemetry = ?, telemetry_ts = ?, escalations_sent = ?, "
            f"last_seen = ?, online = ?, {sets}, updated_at = ?, heard_at = ? "
            "WHERE device_id = ? AND revoked_at IS NULL "
            "AND (telemetry_ts IS NULL OR telemetry_ts < ?)",
            [(*row, now, now, device_id, row[1]) for device_id, row in newest.items()],
        )
        cols = ", ".join(SUMMARY_COLUMNS)
        marks = ", ".join("?" for _ in SUMMARY_COLUMNS)
        insert = (
            f"INSERT INTO fleet_telemetry_history (device_id, bucket, {cols}) "
            f"VALUES (?, ?, {marks}) ON CONFLICT (device_id, bucket) "
        )
        updates = ", ".join(f"{c} = excluded.{c}" for c in SUMMARY_COLUMNS)
        self.db.execute_many(insert + f"DO UPDATE SET {updates}", fresh)
        self.db.execute_many(insert + "DO NOTHING", late)
        TELEMETRY_RECORDED.inc(len(batch))
        with self._lock:
            before = self._writes
            self._writes += len(batch)
            prune = self._writes // 1000 != before // 1000
        if prune:
            self.prune()

    def prune(self) -> int:
        cutoff = int(utcnow().timestamp()) - self.retention_s
        return self.db.execute("DELETE FROM fleet_telemetry_history WHERE bucket < ?", (cutoff,))

    def history(self, device_id: str, *, hours: float = 6.0) -> list[HistoryPoint]:
        """The device's samples of the last `hours`; NotFound if it is not enrolled."""
        if not self.db.query_one(
            "SELECT device_id FROM fleet_devices WHERE device_id = ? AND revoked_at IS NULL",
            (device_id,),
        ):
            raise NotFound(f"device {device_id!r} is not enrolled")
        since = int(utcnow().timestamp() - hours * 3600)
        rows = self.db.query(
            f"SELECT bucket, {', '.join(SUMMARY_COLUMNS)} FROM fleet_telemetry_history "
            "WHERE device_id = ? AND bucket >= ? ORDER BY bucket",
            (device_id, since),
        )
        return [
            HistoryPoint(
                ts=datetime.fromtimestamp(r.pop("bucket"), timezone.utc),
                **{k: v for k, v in r.items()},
            )
            for r in rows
        ]


def _escalation_rate(t: DeviceTelemetry, prev: dict[str, Any]) -> float | None:
    """Escalations per minute since the device's previous telemetry (None if unknown)."""
    if prev["escalations_sent"] is None or prev["last_seen"] is None:
        return None
    dt: float = (t.ts - prev["last_seen"]).total_seconds()
    if dt <= 0 or t.escalations.sent < prev["escalations_sent"]:
        return None
    sent: int = t.escalations.sent - prev["escalations_sent"]
    return sent * 60.0 / dt


def _summarise(t: DeviceTelemetry) -> dict[str, Any]:
    gpu = t.gpu
    p95 = max((s.latency_ms.p95 for s in t.streams), default=None)
    return {
        "fps": sum(s.fps for s in t.streams) if t.streams else None,
        "latency_p95": p95,
        "cpu_pct": t.cpu_pct,
        "gpu_util": gpu.util_pct if gpu else None,
        "gpu_temp": gpu.temp_c if gpu else None,
        "gpu_power": gpu.power_w if gpu else None,
        "outbox_depth": t.outbox_depth,
        "agreement": t.agreement_rate,
    }
