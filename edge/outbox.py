"""The disk outbox: every outgoing message is stored here first and removed only on PUBACK.

An escalation is kept beyond its PUBACK, aside (`awaiting`), until the cloud's verdict for
it arrives: a broker that crashes (`kill -9`, power) between its PUBACK and its delivery to
the cloud loses what it held in memory, so an acknowledged case still unanswered after a
while is sent again (`answers`: edge/outbox_answers.py; the cloud is idempotent by case id,
a repeat is answered from its store, never run twice), at most `max_resends` times, then
dropped and counted. The file (tables, migration, recovery) is edge/outbox_file.py.

SQLite in WAL mode. fsync policy: `synchronous=FULL` by default — in WAL mode that fsyncs
the log on every commit, so a message whose `put` returned survives a power cut, not just
a crash of the agent (NORMAL would survive `kill -9` but may lose the last commits when
power fails; it is offered as `outbox.synchronous: normal` for flash that wears fast).

Bounded by count and bytes; when full it drops by priority — telemetry first, then other
status messages, escalations last — oldest first within a priority, and counts each drop.
A corrupt file is moved aside at start and a fresh one is created: the agent starts anyway.

A row is a message serialised once (`edgefleet.shared.wire.Serialised`): the uplink signs
it as read, re-serialising only to restamp one that waited too long. The file of an older
agent (rows of topic + JSON) is migrated in place when it is opened, queued rows included.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter

from edgefleet.edge.outbox_answers import AnswerWait
from edgefleet.edge.outbox_file import open_file
from edgefleet.edge.outbox_tally import (
    CHANNEL_OF,
    KIND_OF,
    PRIORITY,
    DropReason,
    OutboxKind,
    Tally,
)
from edgefleet.shared.topics import Channel, channel_of
from edgefleet.shared.wire import Serialised

log = logging.getLogger(__name__)

PUT = Counter("ef_edge_outbox_put_total", "Messages accepted into the outbox", ["kind"])
ACKED = Counter("ef_edge_outbox_acked_total", "Messages removed on PUBACK", ["kind"])


@dataclass(frozen=True)
class OutboxItem:
    """One stored message: what it is, the message serialised, how to send it."""

    id: int
    kind: OutboxKind
    message: Serialised
    qos: int
    retain: bool
    created: float  # wall clock when stored

    @property
    def channel(self) -> Channel:
        return CHANNEL_OF[self.kind]


class Outbox:
    """Thread-safe: the pipeline puts, the uplink reads and acks, telemetry counts."""

    def __init__(
        self,
        path: Path,
        *,
        max_messages: int = 100_000,
        max_bytes: int = 512 * 1024 * 1024,
        synchronous: str = "full",
    ):
        self.path = Path(path)
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.synchronous = synchronous
        self._lock = threading.Lock()
        self._db, self.recovered_from = open_file(self.path, synchronous)
        self._tally = Tally(self._db)
        self.answers = AnswerWait(self._db, self._lock, self._tally)

    # --- counters ----------------------------------------------------------------------

    def next_seq(self) -> int:
        """The next telemetry seq, persisted before it is returned (never repeats)."""
        with self._lock:
            row = self._db.execute(
                "INSERT INTO counters VALUES ('telemetry_seq', 1) ON CONFLICT(name) "
                "DO UPDATE SET value = value + 1 RETURNING value"
            ).fetchone()
            return int(row[0])

    # --- put / read / ack --------------------------------------------------------------

    def put(self, message: Serialised, *, qos: int = 1, retain: bool = False) -> int:
        """Store one message durably (per the fsync policy) and return its id.

        Returns 0 when the outbox is full of messages that rank higher (the drop is counted).
        """
        channel = channel_of(message.schema_id)
        if channel not in KIND_OF:
            raise ValueError(f"{message.schema_id} is not sent through the outbox")
        kind = KIND_OF[channel]
        size = len(message.json) + len(message.image or b"")
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if not self._make_room(size, PRIORITY[kind]):
                    self._tally.drop(kind)
                    self._db.execute("COMMIT")
                    self._tally.publish()
                    return 0
                cur = self._db.execute(
                    "INSERT INTO messages (kind, priority, schema, body, image, content_type, "
                    "qos, retain, size, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        kind,
                        PRIORITY[kind],
                        message.schema_id,
                        message.json,
                        message.image,
                        message.content_type,
                        qos,
                        int(retain),
                        size,
                        time.time(),
                    ),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._tally.added(size)
            self._tally.publish()
        PUT.labels(kind).inc()
        return int(cur.lastrowid or 0)

    def _make_room(self, size: int, priority: int) -> bool:
        """Drop by policy until one more message of `size` fits (inside the transaction).

        False when the newcomer itself is the one to drop (all stored messages rank higher).
        """
        tally = self._tally
        while tally.count > 0 and (
            tally.count + 1 > self.max_messages or tally.bytes + size > self.max_bytes
        ):
            row = self._db.execute(
                "SELECT id, kind, size FROM messages ORDER BY priority, id LIMIT 1"
            ).fetchone()
            if row is None:
                break
            if PRIORITY[row[1]] > priority:
                return False  # everything stored matters more than the newcomer
            self._db.execute("DELETE FROM messages WHERE id = ?", (row[0],))
            self._tally.drop(row[1])
            self._tally.removed(int(row[2]))
            log.warning("outbox full: dropped %s message %d", row[1], row[0])
        return True

    def read(self, after_id: int, up_to_id: int | None = None, limit: int = 64) -> list[OutboxItem]:
        """Messages with after_id < id (<= up_to_id), oldest first."""
        query = (
            "SELECT id, kind, schema, body, image, content_type, qos, retain, created "
            "FROM messages WHERE id > ?"
        )
        args: tuple[int, ...] = (after_id,)
        if up_to_id is not None:
            query += " AND id <= ?"
            args = (after_id, up_to_id)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY id LIMIT ?", (*args, limit)).fetchall()
        return [
            OutboxItem(
                id=r[0],
                kind=r[1],
                message=Serialised(r[2], bytes(r[3]), None if r[4] is None else bytes(r[4]), r[5]),
                qos=r[6],
                retain=bool(r[7]),
                created=r[8],
            )
            for r in rows
        ]

    def ack(self, ids: list[int]) -> int:
        """Remove acknowledged messages; returns how many were still there."""
        if not ids:
            return 0
        removed = 0
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for message_id in ids:
                    row = self._db.execute(
                        "DELETE FROM messages WHERE id = ? "
                        "RETURNING kind, size, schema, body, image, content_type, qos, created",
                        (message_id,),
                    ).fetchone()
                    if row is not None:
                        removed += 1
                        self._tally.removed(int(row[1]))
                        ACKED.labels(row[0]).inc()
                        if row[0] == "escalation":
                            self.answers.keep(row)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._tally.publish()
        return removed

    def max_id(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone()
        return int(row[0])

    def depth(self, kind: OutboxKind | None = None) -> int:
        if kind is None:
            return self._tally.count
        with self._lock:
            row = self._db.execute(
                "SELECT count(*) FROM messages WHERE kind = ?", (kind,)
            ).fetchone()
        return int(row[0])

    @property
    def size_bytes(self) -> int:
        return self._tally.bytes

    @property
    def dropped(self) -> dict[DropReason, int]:
        """Messages dropped, by reason, over the file's life."""
        return self._tally.dropped

    @property
    def dropped_total(self) -> int:
        return sum(self._tally.dropped.values())

    def writable(self) -> bool:
        """Whether a write transaction can start now (for /readyz)."""
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute("ROLLBACK")
            return True
        except sqlite3.Error:
            return False

    def checkpoint(self) -> None:
        """Fold the WAL into the main file (on shutdown)."""
        with self._lock:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        with self._lock:
            self._db.close()
