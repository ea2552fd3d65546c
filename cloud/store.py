"""The cloud's case store: the ledger of cases and verdicts, their images, feedback and
the export, and the look-ups that read them back, on one database.

Telemetry history lives beside it in the same database, kept by the device registry
(edgefleet.fleet.registry: last message in full plus one downsampled sample per bucket).

One schema for SQLite and PostgreSQL through edgefleet.shared.db; images live on disk beside
the database (`ImageStore`).
"""

from __future__ import annotations

from pathlib import Path

from edgefleet.cloud.feedback import FeedbackLog
from edgefleet.cloud.images import ImageStore
from edgefleet.cloud.ledger import CaseLedger
from edgefleet.cloud.lookup import CaseLookup
from edgefleet.shared.db import Database


class CaseStore:
    """The store's parts on one database, its schema migrated once they are built."""

    def __init__(self, db: Database, images_dir: Path):
        db.migrate("cloud_001_feedback_store", _schema(db))
        db.migrate("cloud_002_deliveries", _deliveries_schema(db))
        db.migrate("cloud_003_case_per_device", _case_per_device_schema(db))
        self.db = db
        self.images = ImageStore(images_dir)
        self.lookup = CaseLookup(db)
        self.ledger = CaseLedger(db, self.images, self.lookup)
        self.feedback = FeedbackLog(db, self.lookup)


def _schema(db: Database) -> list[str]:
    t = db.types
    return [
        f"""CREATE TABLE ef_cases (
            case_id TEXT PRIMARY KEY,
            device_id TEXT NOT NULL,
            stream_id TEXT NOT NULL,
            frame_index {t.bigint} NOT NULL,
            reason TEXT NOT NULL,
            trace_id TEXT NOT NULL,
            edge_model TEXT NOT NULL,
            edge_model_version TEXT NOT NULL,
            edge_score {t.double},
            meta TEXT NOT NULL,
            image_sha256 TEXT NOT NULL,
            image_path TEXT NOT NULL,
            content_type TEXT NOT NULL,
            image_bytes {t.bigint} NOT NULL,
            source TEXT NOT NULL,
            received_at {t.timestamp} NOT NULL,
            status TEXT NOT NULL,
            claimed_by TEXT,
            claimed_at {t.timestamp},
            attempts INTEGER NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX ef_cases_device_time ON ef_cases (device_id, received_at)",
        "CREATE INDEX ef_cases_time ON ef_cases (received_at, case_id)",
        f"""CREATE TABLE ef_verdicts (
            case_id TEXT PRIMARY KEY REFERENCES ef_cases(case_id) ON DELETE CASCADE,
            verdict TEXT NOT NULL,
            model TEXT NOT NULL,
            route TEXT NOT NULL,
            fallback_level INTEGER NOT NULL,
            latency_ms {t.double} NOT NULL,
            cached {t.boolean} NOT NULL,
            processed_by TEXT NOT NULL,
            created_at {t.timestamp} NOT NULL
        )""",
        f"""CREATE TABLE ef_feedback (
            id {t.autoid},
            case_id TEXT NOT NULL REFERENCES ef_cases(case_id) ON DELETE CASCADE,
            label TEXT NOT NULL,
            correct {t.boolean} NOT NULL,
            author TEXT,
            principal TEXT NOT NULL,
            signature TEXT NOT NULL,
            received_at {t.timestamp} NOT NULL
        )""",
        "CREATE INDEX ef_feedback_case ON ef_feedback (case_id, received_at)",
        f"CREATE TABLE ef_health (id INTEGER PRIMARY KEY, checked_at {t.timestamp} NOT NULL)",
    ]


def _deliveries_schema(db: Database) -> list[str]:
    """One row per copy of a case that reached a replica (MQTT or REST): a case delivered
    twice has two rows and one ef_cases row, so duplicates are counted from the store; and
    per case the cascade runs that completed (a verdict computed twice is a duplicate)."""
    t = db.types
    return [
        f"""CREATE TABLE ef_deliveries (
            id {t.autoid},
            case_id TEXT NOT NULL,
            source TEXT NOT NULL,
            replica TEXT NOT NULL,
            received_at {t.timestamp} NOT NULL
        )""",
        "CREATE INDEX ef_deliveries_case ON ef_deliveries (case_id)",
        # cascade runs that reached a verdict: more than one is a case processed twice
        "ALTER TABLE ef_cases ADD COLUMN completed_runs INTEGER NOT NULL DEFAULT 0",
    ]


_CASE_COLUMNS = (
    "case_id, device_id, stream_id, frame_index, reason, trace_id, edge_model, "
    "edge_model_version, edge_score, meta, image_sha256, image_path, content_type, "
    "image_bytes, source, received_at, status, claimed_by, claimed_at, attempts, completed_runs"
)
_VERDICT_COLUMNS = (
    "case_id, verdict, model, route, fallback_level, latency_ms, cached, processed_by, created_at"
)
_FEEDBACK_COLUMNS = "case_id, label, correct, author, principal, signature, received_at"


def _case_per_device_schema(db: Database) -> list[str]:
    """Case ids scoped per device: the key of a case (and of its verdict and feedback) is
    (device_id, case_id), so a device that reuses another device's id gets its own case.
    Tables rebuilt (SQLite cannot change a primary key in place), rows kept: children are
    copied and dropped before the old cases, so no cascade can delete them."""
    t = db.types
    return [
        f"""CREATE TABLE ef_cases_v3 (
            case_id TEXT NOT NULL,
            device_id TEXT NOT NULL,
            stream_id TEXT NOT NULL,
            frame_index {t.bigint} NOT NULL,
            reason TEXT NOT NULL,
            trace_id TEXT NOT NULL,
            edge_model TEXT NOT NULL,
            edge_model_version TEXT NOT NULL,
            edge_score {t.double},
            meta TEXT NOT NULL,
            image_sha256 TEXT NOT NULL,
            image_path TEXT NOT NULL,
            content_type TEXT NOT NULL,
            image_bytes {t.bigint} NOT NULL,
            source TEXT NOT NULL,
            received_at {t.timestamp} NOT NULL,
            status TEXT NOT NULL,
            claimed_by TEXT,
            claimed_at {t.timestamp},
            attempts INTEGER NOT NULL DEFAULT 0,
            completed_runs INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (device_id, case_id)
        )""",
        f"INSERT INTO ef_cases_v3 ({_CASE_COLUMNS}) SELECT {_CASE_COLUMNS} FROM ef_cases",
        f"""CREATE TABLE ef_verdicts_v3 (
            device_id TEXT NOT NULL,
            case_id TEXT NOT NULL,
            verdict TEXT NOT NULL,
            model TEXT NOT NULL,
            route TEXT NOT NULL,
            fallback_level INTEGER NOT NULL,
            latency_ms {t.double} NOT NULL,
            cached {t.boolean} NOT NULL,
            processed_by TEXT NOT NULL,
            created_at {t.timestamp} NOT NULL,
            PRIMARY KEY (device_id, case_id),
            FOREIGN KEY (device_id, case_id) REFERENCES ef_cases_v3 (device_id, case_id)
                ON DELETE CASCADE
        )""",
        f"""INSERT INTO ef_verdicts_v3 (device_id, {_VERDICT_COLUMNS})
            SELECT c.device_id, {", ".join("v." + c for c in _VERDICT_COLUMNS.split(", "))}
            FROM ef_verdicts v JOIN ef_cases c ON c.case_id = v.case_id""",
        f"""CREATE TABLE ef_feedback_v3 (
            id {t.autoid},
            device_id TEXT NOT NULL,
            case_id TEXT NOT NULL,
            label TEXT NOT NULL,
            correct {t.boolean} NOT NULL,
            author TEXT,
            principal TEXT NOT NULL,
            signature TEXT NOT NULL,
            received_at {t.timestamp} NOT NULL,
            FOREIGN KEY (device_id, case_id) REFERENCES ef_cases_v3 (device_id, case_id)
                ON DELETE CASCADE
        )""",
        # new ids in the old order (ids only break ties of received_at)
        f"""INSERT INTO ef_feedback_v3 (device_id, {_FEEDBACK_COLUMNS})
            SELECT c.device_id, {", ".join("f." + c for c in _FEEDBACK_COLUMNS.split(", "))}
            FROM ef_feedback f JOIN ef_cases c ON c.case_id = f.case_id ORDER BY f.id""",
        "DROP TABLE ef_feedback",
        "DROP TABLE ef_verdicts",
        "DROP TABLE ef_cases",
        "ALTER TABLE ef_cases_v3 RENAME TO ef_cases",
        "ALTER TABLE ef_verdicts_v3 RENAME TO ef_verdicts",
        "ALTER TABLE ef_feedback_v3 RENAME TO ef_feedback",
        "CREATE INDEX ef_cases_device_time ON ef_cases (device_id, received_at)",
        "CREATE INDEX ef_cases_time ON ef_cases (received_at, case_id, device_id)",
        "CREATE INDEX ef_cases_case ON ef_cases (case_id)",  # an operator's look-up by id
        "CREATE INDEX ef_feedback_case ON ef_feedback (device_id, case_id, received_at)",
        # a copy refused before its claim is noted under the device it came from
        "ALTER TABLE ef_deliveries ADD COLUMN device_id TEXT",
        """UPDATE ef_deliveries SET device_id = (
            SELECT MIN(c.device_id) FROM ef_cases c WHERE c.case_id = ef_deliveries.case_id)""",
        "CREATE INDEX ef_deliveries_device_case ON ef_deliveries (device_id, case_id)",
    ]
