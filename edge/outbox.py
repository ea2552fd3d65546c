"""The disk outbox: every outgoing message is stored here first and removed only on PUBACK.

An escalation is kept beyond its PUBACK, aside (`awaiting`), until the cloud's verdict for
it arrives: a broker that crashes (`kill -9`, power) between its PUBACK and its delivery to
the cloud loses what it held in memory, so an acknowledged case still unanswered after
`resend_unanswered` is sent again (the cloud is idempotent by case id: a repeat is answered
from its store, never run twice), at most `max_resends` times, then dropped and counted.

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

import json
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from prometheus_client import Counter, Gauge

from edgefleet.shared.errors import ConfigError, EdgefleetError
from edgefleet.shared.private import private_dir, private_file
from edgefleet.shared.topics import Channel, channel_of
from edgefleet.shared.wire import Serialised

log = logging.getLogger(__name__)

DEPTH = Gauge("ef_edge_outbox_depth", "Messages waiting in the outbox")
BYTES = Gauge("ef_edge_outbox_bytes", "Bytes waiting in the outbox")
PUT = Counter("ef_edge_outbox_put_total", "Messages accepted into the outbox", ["kind"])
ACKED = Counter("ef_edge_outbox_acked_total", "Messages removed on PUBACK", ["kind"])
DROPPED = Counter("ef_edge_outbox_dropped_total", "Messages dropped by the size bound", ["kind"])
CORRUPT = Counter("ef_edge_outbox_corrupt_total", "Corrupt outbox files moved aside at start")
AWAITING = Gauge(
    "ef_edge_outbox_awaiting_answer", "Escalations the broker acknowledged, kept until answered"
)
RESENT_UNANSWERED = Counter(
    "ef_edge_outbox_unanswered_resent_total", "Acknowledged escalations sent again, unanswered"
)

# How long an answered case is remembered: a copy of it sent again just before the verdict
# may still be acknowledged after it (and must not wait for a second verdict).
ANSWERED_KEEP_S = 24 * 3600

# Errors opening the file that say nothing about its content (permissions, locks, disk).
_NOT_CORRUPT = frozenset(
    {
        "SQLITE_CANTOPEN",
        "SQLITE_PERM",
        "SQLITE_READONLY",
        "SQLITE_BUSY",
        "SQLITE_LOCKED",
        "SQLITE_FULL",
        "SQLITE_IOERR",
        "SQLITE_NOMEM",
    }
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

_MESSAGES = """
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    priority INTEGER NOT NULL,
    schema TEXT NOT NULL,
    body BLOB NOT NULL,
    image BLOB,
    content_type TEXT,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    size INTEGER NOT NULL,
    created REAL NOT NULL
)
"""
_SCHEMA = f"""
{_MESSAGES};
CREATE INDEX IF NOT EXISTS messages_drop ON messages (priority, id);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS awaiting (
    case_id TEXT PRIMARY KEY,
    schema TEXT NOT NULL,
    body BLOB NOT NULL,
    image BLOB,
    content_type TEXT,
    qos INTEGER NOT NULL,
    size INTEGER NOT NULL,
    created REAL NOT NULL,
    acked REAL NOT NULL,
    resends INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS answered (case_id TEXT PRIMARY KEY, at REAL NOT NULL);
"""


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
        self.recovered_from: Path | None = None
        self._lock = threading.Lock()
        self._db = self._open()
        count, size = self._db.execute(
            "SELECT count(*), coalesce(sum(size), 0) FROM messages"
        ).fetchone()
        self._count, self._bytes = int(count), int(size)
        self.dropped: dict[DropReason, int] = {
            kind: self._counter(f"dropped_{kind}") for kind in PRIORITY
        }
        if unanswered := self._counter(f"dropped_{UNANSWERED}"):  # shown once it happened
            self.dropped[UNANSWERED] = unanswered
        self._publish_gauges()

    # --- opening and recovery ----------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={self.synchronous.upper()}")
        row = db.execute("PRAGMA quick_check").fetchone()
        if row is None or row[0] != "ok":
            db.close()
            raise sqlite3.DatabaseError(f"quick_check: {row[0] if row else 'no answer'}")
        _migrate_topic_rows(db)
        db.executescript(_SCHEMA)
        return db

    def _open(self) -> sqlite3.Connection:
        private_dir(self.path.parent)
        if self.path.exists() and not self.path.is_file():
            raise ConfigError(f"outbox.path {self.path} is not a file (a directory?)")
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        private_file(self.path)
        try:
            db = self._connect()
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorname", "") in _NOT_CORRUPT:
                # the file may be fine: never move a good outbox aside for these
                raise EdgefleetError(
                    f"cannot open the outbox {self.path}: {exc}",
                    hint="check the folder's permissions, free space, and that no other "
                    "agent uses this outbox",
                ) from None
            self.recovered_from = self._move_aside(exc)
            fresh = True
            private_file(self.path)
            db = self._connect()
        if fresh:
            # Telemetry seq starts at the wall clock in ms, so a new (or recovered) outbox
            # never repeats a seq the cloud has already seen from this device.
            db.execute(
                "INSERT OR IGNORE INTO counters VALUES ('telemetry_seq', ?)",
                (int(time.time() * 1000),),
            )
        return db

    def _move_aside(self, exc: Exception) -> Path:
        target = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        for suffix in ("", "-wal", "-shm"):
            part = Path(str(self.path) + suffix)
            if part.exists():
                part.replace(Path(str(target) + suffix))
        CORRUPT.inc()
        log.error(
            "outbox %s is corrupt (%s): moved aside to %s, starting with an empty outbox",
            self.path,
            exc,
            target,
        )
        return target

    # --- counters ----------------------------------------------------------------------

    def _counter(self, name: str) -> int:
        row = self._db.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else 0

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
                    self._count_drop(kind)
                    self._db.execute("COMMIT")
                    self._publish_gauges()
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
            self._count += 1
            self._bytes += size
            self._publish_gauges()
        PUT.labels(kind).inc()
        return int(cur.lastrowid or 0)

    def _make_room(self, size: int, priority: int) -> bool:
        """Drop by policy until one more message of `size` fits (inside the transaction).

        False when the newcomer itself is the one to drop (all stored messages rank higher).
        """
        while self._count > 0 and (
            self._count + 1 > self.max_messages or self._bytes + size > self.max_bytes
        ):
            row = self._db.execute(
                "SELECT id, kind, size FROM messages ORDER BY priority, id LIMIT 1"
            ).fetchone()
            if row is None:
                break
            if PRIORITY[row[1]] > priority:
                return False  # everything stored matters more than the newcomer
            self._db.execute("DELETE FROM messages WHERE id = ?", (row[0],))
            self._count_drop(row[1])
            self._count -= 1
            self._bytes -= int(row[2])
            log.warning("outbox full: dropped %s message %d", row[1], row[0])
        return True

    def _count_drop(self, kind: DropReason) -> None:
        self._db.execute(
            "INSERT INTO counters VALUES (?, 1) ON CONFLICT(name) DO UPDATE SET value = value + 1",
            (f"dropped_{kind}",),
        )
        self.dropped[kind] = self.dropped.get(kind, 0) + 1
        DROPPED.labels(kind).inc()

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
                        self._count -= 1
                        self._bytes -= int(row[1])
                        ACKED.labels(row[0]).inc()
                        if row[0] == "escalation":
                            self._await_answer(row)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._publish_gauges()
        return removed

    def max_id(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone()
        return int(row[0])

    def depth(self, kind: OutboxKind | None = None) -> int:
        if kind is None:
            return self._count
        with self._lock:
            row = self._db.execute(
                "SELECT count(*) FROM messages WHERE kind = ?", (kind,)
            ).fetchone()
        return int(row[0])

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    def writable(self) -> bool:
        """Whether a write transaction can start now (for /readyz)."""
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute("ROLLBACK")
            return True
        except sqlite3.Error:
            return False

    def _await_answer(self, row: tuple[Any, ...]) -> None:
        """Keep an acknowledged escalation aside until its verdict (inside the transaction)."""
        try:
            case_id = str(json.loads(row[3])["case_id"])
        except (ValueError, KeyError, TypeError):
            return  # not a case we can match to a verdict: PUBACK is all we can wait for
        if self._db.execute("SELECT 1 FROM answered WHERE case_id = ?", (case_id,)).fetchone():
            return  # a copy sent again before the verdict came: nothing left to wait for
        self._db.execute(
            "INSERT INTO awaiting (case_id, schema, body, image, content_type, qos, size, "
            "created, acked) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(case_id) DO UPDATE SET acked = excluded.acked",
            (case_id, row[2], row[3], row[4], row[5], row[6], row[1], row[7], time.time()),
        )

    def answered(self, case_id: str) -> bool:
        """The cloud's verdict for the case arrived: the copy kept for it goes."""
        with self._lock:
            cur = self._db.execute("DELETE FROM awaiting WHERE case_id = ?", (case_id,))
            self._db.execute(
                "INSERT OR REPLACE INTO answered VALUES (?, ?)", (case_id, time.time())
            )
            self._publish_gauges()
        return cur.rowcount > 0

    def resend_unanswered(self, older_than_s: float, max_resends: int) -> int:
        """Put back in line the escalations acknowledged more than `older_than_s` ago and
        still unanswered; drop (and count) those already sent again `max_resends` times."""
        now = time.time()
        again = 0
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                # a copy's PUBACK comes within a resend interval of its verdict, or never
                self._db.execute("DELETE FROM answered WHERE at < ?", (now - ANSWERED_KEEP_S,))
                rows = self._db.execute(
                    "SELECT case_id, schema, body, image, content_type, qos, size, created, "
                    "resends FROM awaiting WHERE acked < ? ORDER BY acked",
                    (now - older_than_s,),
                ).fetchall()
                for case_id, schema, body, image, content_type, qos, size, created, resends in rows:
                    if resends >= max_resends:
                        self._db.execute("DELETE FROM awaiting WHERE case_id = ?", (case_id,))
                        self._count_drop(UNANSWERED)
                        log.error("case %s: no answer after %d resends, dropped", case_id, resends)
                        continue
                    self._db.execute(
                        "INSERT INTO messages (kind, priority, schema, body, image, content_type, "
                        "qos, retain, size, created) "
                        "VALUES ('escalation', ?, ?, ?, ?, ?, ?, 0, ?, ?)",
                        (
                            PRIORITY["escalation"],
                            schema,
                            body,
                            image,
                            content_type,
                            qos,
                            size,
                            created,
                        ),
                    )
                    self._db.execute(
                        "UPDATE awaiting SET resends = resends + 1, acked = ? WHERE case_id = ?",
                        (now, case_id),
                    )
                    self._count += 1
                    self._bytes += int(size)
                    again += 1
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._publish_gauges()
        if again:
            RESENT_UNANSWERED.inc(again)
            log.warning(
                "%d acknowledged case(s) unanswered after %.0f s: sent again", again, older_than_s
            )
        return again

    def awaiting(self) -> int:
        """Escalations the broker acknowledged and the cloud has not answered yet."""
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM awaiting").fetchone()[0])

    def checkpoint(self) -> None:
        """Fold the WAL into the main file (on shutdown)."""
        with self._lock:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _publish_gauges(self) -> None:
        DEPTH.set(self._count)
        BYTES.set(self._bytes)
        AWAITING.set(self._db.execute("SELECT count(*) FROM awaiting").fetchone()[0])


def _migrate_topic_rows(db: sqlite3.Connection) -> None:
    """Rewrite the table of an older agent (topic + JSON rows) as typed rows, in place.

    Queued messages keep their ids and order; the topic is no longer stored (the uplink
    builds it from the kind), the schema and a case's image type are read from the JSON
    once here. A row that is not a message cannot be sent either: it is logged and left out.
    """
    columns = {row[1] for row in db.execute("PRAGMA table_info(messages)")}
    if "topic" not in columns:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("ALTER TABLE messages RENAME TO messages_topic_rows")
        db.execute("DROP INDEX IF EXISTS messages_drop")
        db.execute(_MESSAGES)
        kept = lost = 0
        rows = db.execute(
            "SELECT id, kind, priority, body, image, qos, retain, created "
            "FROM messages_topic_rows ORDER BY id"
        )
        for id_, kind, priority, body, image, qos, retain, created in rows.fetchall():
            try:
                meta = json.loads(body)
                schema, content_type = meta["schema"], meta.get("content_type")
            except (ValueError, KeyError, TypeError):
                lost += 1
                log.error("outbox row %d is not a message; left out of the migration", id_)
                continue
            db.execute(
                "INSERT INTO messages (id, kind, priority, schema, body, image, content_type, "
                "qos, retain, size, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    id_,
                    kind,
                    priority,
                    schema,
                    body,
                    image,
                    content_type if image is not None else None,
                    qos,
                    retain,
                    len(body) + len(image or b""),
                    created,
                ),
            )
            kept += 1
        # ids never go back: the new table continues where the old one's sequence was
        # (sqlite_sequence has no key on name: update the new table's row, or add one)
        (used,) = db.execute(
            "SELECT coalesce(max(seq), 0) FROM sqlite_sequence WHERE name = 'messages_topic_rows'"
        ).fetchone()
        db.execute("DELETE FROM sqlite_sequence WHERE name = 'messages'")
        db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('messages', ?)", (used,))
        db.execute("DROP TABLE messages_topic_rows")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    log.info("outbox migrated to typed rows: %d kept, %d not messages", kept, lost)
