"""The outbox's file: its tables, the migration of an older agent's rows, and the recovery
of a corrupt file (moved aside, a fresh one made: the agent starts anyway)."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from pathlib import Path

from prometheus_client import Counter

from edgefleet.shared.errors import ConfigError, EdgefleetError
from edgefleet.shared.private import private_dir, private_file

log = logging.getLogger(__name__)

CORRUPT = Counter("ef_edge_outbox_corrupt_total", "Corrupt outbox files moved aside at start")

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


def open_file(path: Path, synchronous: str) -> tuple[sqlite3.Connection, Path | None]:
    """The outbox's database, checked, migrated and with its tables; a corrupt file moved
    aside first (returned as the second item) and a fresh one made."""
    recovered_from = None
    private_dir(path.parent)
    if path.exists() and not path.is_file():
        raise ConfigError(f"outbox.path {path} is not a file (a directory?)")
    fresh = not path.exists() or path.stat().st_size == 0
    private_file(path)
    try:
        db = _connect(path, synchronous)
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorname", "") in _NOT_CORRUPT:
            # the file may be fine: never move a good outbox aside for these
            raise EdgefleetError(
                f"cannot open the outbox {path}: {exc}",
                hint="check the folder's permissions, free space, and that no other "
                "agent uses this outbox",
            ) from None
        recovered_from = _move_aside(path, exc)
        fresh = True
        private_file(path)
        db = _connect(path, synchronous)
    if fresh:
        # Telemetry seq starts at the wall clock in ms, so a new (or recovered) outbox
        # never repeats a seq the cloud has already seen from this device.
        db.execute(
            "INSERT OR IGNORE INTO counters VALUES ('telemetry_seq', ?)",
            (int(time.time() * 1000),),
        )
    return db, recovered_from


def _connect(path: Path, synchronous: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous.upper()}")
    row = db.execute("PRAGMA quick_check").fetchone()
    if row is None or row[0] != "ok":
        db.close()
        raise sqlite3.DatabaseError(f"quick_check: {row[0] if row else 'no answer'}")
    migrate_topic_rows(db)
    db.executescript(_SCHEMA)
    return db


def _move_aside(path: Path, exc: Exception) -> Path:
    target = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    for suffix in ("", "-wal", "-shm"):
        part = Path(str(path) + suffix)
        if part.exists():
            part.replace(Path(str(target) + suffix))
    CORRUPT.inc()
    log.error(
        "outbox %s is corrupt (%s): moved aside to %s, starting with an empty outbox",
        path,
        exc,
        target,
    )
    return target


def migrate_topic_rows(db: sqlite3.Connection) -> None:
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
