"""What the outbox carries and what it holds: the kinds and their drop order, and the tally
of messages, bytes and drops kept in memory beside the file, changed inside the same
transactions as the rows."""

from __future__ import annotations

import sqlite3
from typing import Literal

from prometheus_client import Counter, Gauge

from edgefleet.shared.topics import Channel

DEPTH = Gauge("ef_edge_outbox_depth", "Messages waiting in the outbox")
BYTES = Gauge("ef_edge_outbox_bytes", "Bytes waiting in the outbox")
DROPPED = Counter("ef_edge_outbox_dropped_total", "Messages dropped by the size bound", ["kind"])
AWAITING = Gauge(
    "ef_edge_outbox_awaiting_answer", "Escalations the broker acknowledged, kept until answered"
)

# What the outbox carries, by the name its metrics, counters and health use.
OutboxKind = Literal["telemetry", "reported", "escalation"]
KIND_OF: dict[Channel, OutboxKind] = {
    Channel.TELEMETRY: "telemetry",
    Channel.REPORTED: "reported",
    Channel.ESCALATIONS: "escalation",
}
CHANNEL_OF: dict[OutboxKind, Channel] = {kind: channel for channel, kind in KIND_OF.items()}

# Drop order when full: lowest priority first.
PRIORITY: dict[OutboxKind, int] = {"telemetry": 0, "reported": 1, "escalation": 2}
# Why a message was dropped: its kind (the size bound), or an escalation never answered.
DropReason = OutboxKind | Literal["escalation_unanswered"]
UNANSWERED: DropReason = "escalation_unanswered"  # sent `max_resends` times, never answered


class Tally:
    """Messages and bytes in line, and drops by reason (persisted in `counters`), read from
    the file once; the callers hold the outbox's lock and change it with their rows."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        count, size = db.execute("SELECT count(*), coalesce(sum(size), 0) FROM messages").fetchone()
        self.count, self.bytes = int(count), int(size)
        self.dropped: dict[DropReason, int] = {kind: self._read(kind) for kind in PRIORITY}
        if unanswered := self._read(UNANSWERED):  # shown once it happened
            self.dropped[UNANSWERED] = unanswered
        self.publish()

    def _read(self, reason: DropReason) -> int:
        row = self._db.execute(
            "SELECT value FROM counters WHERE name = ?", (f"dropped_{reason}",)
        ).fetchone()
        return int(row[0]) if row else 0

    def added(self, size: int) -> None:
        self.count += 1
        self.bytes += size

    def removed(self, size: int) -> None:
        self.count -= 1
        self.bytes -= size

    def drop(self, reason: DropReason) -> None:
        """Count one drop, in the file (inside the caller's transaction) and in memory."""
        self._db.execute(
            "INSERT INTO counters VALUES (?, 1) ON CONFLICT(name) DO UPDATE SET value = value + 1",
            (f"dropped_{reason}",),
        )
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        DROPPED.labels(reason).inc()

    def publish(self) -> None:
        DEPTH.set(self.count)
        BYTES.set(self.bytes)
        AWAITING.set(self._db.execute("SELECT count(*) FROM awaiting").fetchone()[0])
