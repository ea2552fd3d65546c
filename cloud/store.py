"""The feedback store: cases, edge and cloud results, verdicts and signed feedback.

Telemetry history lives beside it in the same database, kept by the device registry
(edgefleet.fleet.registry: last message in full plus one downsampled sample per bucket).

One schema for SQLite and PostgreSQL through edgefleet.shared.db; images live on disk beside the
database, content-addressed by SHA-256 (a case sent twice stores its image once).

Idempotency across replicas is a row claim: the first replica to insert a case owns it;
a replica that finds the case already there answers from its verdict, or waits for the
owner, or takes the case over when the owner's claim is older than `stale_after_s`.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from edgefleet.shared.db import Database
from edgefleet.shared.errors import Conflict, NotFound
from edgefleet.shared.messages import (
    CaseId,
    CloudVerdict,
    EscalationCase,
    Feedback,
    ImageContentType,
    Sha256,
    utcnow,
)

log = logging.getLogger(__name__)

_EXT = {"image/jpeg": "jpg", "image/png": "png"}


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


CaseKey = tuple[str, CaseId]  # (device_id, case_id): a case id is its device's own


def case_key(case: EscalationCase | CloudVerdict) -> CaseKey:
    return (case.device_id, case.case_id)


class ClaimState(str, enum.Enum):
    CLAIMED = "claimed"  # this replica owns the case: run it
    DONE = "done"  # a verdict exists: answer with it
    IN_PROGRESS = "in_progress"  # another worker owns it: wait for its verdict


@dataclass(frozen=True)
class Claim:
    state: ClaimState
    verdict: CloudVerdict | None = None


@dataclass(frozen=True)
class ExportRecord:
    """One training example of the export."""

    case_id: CaseId
    device_id: str
    stream_id: str
    image: str
    content_type: ImageContentType
    label: str
    label_source: str
    # who gave the label: the authenticated sender of the feedback (`device:cam-01`,
    # `operator:ops`), never the free-text author it claims; the model for a cloud label
    label_by: str | None
    edge_result: list[dict[str, Any]]
    cloud_result: list[dict[str, Any]] | None
    cloud_model: str | None
    fallback_level: int | None
    received_at: str

    def to_json(self) -> str:
        return json.dumps(self.__dict__, ensure_ascii=False)


def _iso_z(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _edge_score(case: EscalationCase) -> float | None:
    """The edge's confidence in its own answer: the lowest line score (None if no lines)."""
    return min((d.score for d in case.edge_result), default=None)


class FeedbackStore:
    def __init__(self, db: Database, images_dir: Path):
        self.db = db
        self.images_dir = Path(images_dir)
        self.images_dir.mkdir(parents=True, exist_ok=True)
        db.migrate("cloud_001_feedback_store", _schema(db))
        db.migrate("cloud_002_deliveries", _deliveries_schema(db))
        db.migrate("cloud_003_case_per_device", _case_per_device_schema(db))

    # --- images ---------------------------------------------------------------------

    def image_path(self, sha256: Sha256, content_type: ImageContentType) -> Path:
        return self.images_dir / sha256[:2] / f"{sha256}.{_EXT.get(content_type, 'bin')}"

    def put_image(self, sha256: Sha256, content_type: ImageContentType, data: bytes) -> Path:
        """Write once, atomically (tmp + rename): a crash never leaves half an image."""
        path = self.image_path(sha256, content_type)
        if path.exists():
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    # --- cases and verdicts ---------------------------------------------------------

    def batch(self) -> AbstractContextManager[object]:
        """Claims and verdicts stored inside the block commit together (one transaction):
        the case workers answer cases that need no model in groups."""
        return self.db.transaction()

    def record_delivery(
        self, case_id: CaseId, *, source: str, replica: str, device_id: str | None = None
    ) -> None:
        """Note one arrival of a case that is refused, not claimed (a claim notes its own)."""
        self._delivered(device_id, case_id, source, replica, utcnow())

    def _delivered(
        self, device_id: str | None, case_id: CaseId, source: str, replica: str, at: datetime
    ) -> None:
        self.db.execute(
            "INSERT INTO ef_deliveries (device_id, case_id, source, replica, received_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (device_id, case_id, source, replica, at),
        )

    def claim(
        self,
        case: EscalationCase,
        *,
        image_sha256: Sha256,
        image: bytes,
        source: str,
        replica: str,
        stale_after_s: float,
        replica_started: datetime | None = None,
        meta_json: bytes | None = None,
        delivery: bool = False,
        attempt: bool = False,
    ) -> Claim:
        """Record the case (once) and say whether this replica should run it.

        In the same transaction, `delivery` notes this arrival of the case (one row per
        copy that arrives, before de-duplication) and `attempt` counts the run that follows
        a claim won here (one statement each, not a transaction each).

        `meta_json` is the case's JSON as it arrived and was parsed (MQTT's ef-meta): stored
        as is instead of serialising the case again.

        A pending case is taken over when its claim is older than `stale_after_s`, or when
        it is this replica's own claim from before `replica_started` (its previous life,
        which a crash ended mid-case: the id is never held by two live processes).
        """
        path = self.image_path(image_sha256, case.content_type)
        now = utcnow()
        runs = 1 if attempt else 0
        with self.db.transaction():
            if delivery:
                self._delivered(case.device_id, case.case_id, source, replica, now)
            inserted = self.db.execute(
                """INSERT INTO ef_cases (case_id, device_id, stream_id, frame_index, reason,
                    trace_id, edge_model, edge_model_version, edge_score, meta, image_sha256,
                    image_path, content_type, image_bytes, source, received_at, status,
                    claimed_by, claimed_at, attempts)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?)
                   ON CONFLICT (device_id, case_id) DO NOTHING""",
                (
                    case.case_id,
                    case.device_id,
                    case.stream_id,
                    case.frame_index,
                    case.reason,
                    case.trace_id,
                    case.model.name,
                    case.model.version,
                    _edge_score(case),
                    meta_json.decode() if meta_json else case.model_dump_json(),
                    image_sha256,
                    str(path),
                    case.content_type,
                    len(image),
                    source,
                    now,
                    replica,
                    now,
                    runs,
                ),
            )
            if inserted:
                # written only for a case that is new: a refused copy costs no disk (a write
                # that fails undoes the row with the transaction)
                self.put_image(image_sha256, case.content_type, image)
                return Claim(ClaimState.CLAIMED)
            verdict = self.verdict(case.case_id, device_id=case.device_id)
            if verdict is not None:
                return Claim(ClaimState.DONE, verdict)
            own_before = replica_started or now - timedelta(seconds=stale_after_s)
            taken = self.db.execute(
                """UPDATE ef_cases SET claimed_by = ?, claimed_at = ?, attempts = attempts + ?
                   WHERE device_id = ? AND case_id = ? AND status = 'pending'
                     AND (claimed_at < ? OR (claimed_by = ? AND claimed_at < ?))""",
                (
                    replica,
                    now,
                    runs,
                    case.device_id,
                    case.case_id,
                    now - timedelta(seconds=stale_after_s),
                    replica,
                    own_before,
                ),
            )
            if taken:
                log.warning(
                    "took over stale case %s", case.case_id, extra={"case_id": case.case_id}
                )
                return Claim(ClaimState.CLAIMED)
            verdict = self.verdict(case.case_id, device_id=case.device_id)
            return Claim(ClaimState.DONE, verdict) if verdict else Claim(ClaimState.IN_PROGRESS)

    def stale_cases(
        self,
        *,
        replica: str,
        replica_started: datetime,
        stale_after_s: float,
        limit: int = 100,
    ) -> list[tuple[EscalationCase, bytes]]:
        """Pending cases nobody is working on: claims older than `stale_after_s`, or this
        replica's own from before it started. With their images, to be run again."""
        rows = self.db.query(
            """SELECT device_id, case_id, meta, image_path FROM ef_cases
               WHERE status = 'pending'
                 AND (claimed_at < ? OR (claimed_by = ? AND claimed_at < ?))
               ORDER BY received_at LIMIT ?""",
            (utcnow() - timedelta(seconds=stale_after_s), replica, replica_started, limit),
        )
        found = []
        for row in rows:
            try:
                image = Path(row["image_path"]).read_bytes()
                found.append((EscalationCase.model_validate_json(row["meta"]), image))
            except (OSError, ValueError) as exc:  # logged and set aside, never a crash
                log.error("stale case %s cannot be re-run: %s", row["case_id"], exc)
                self.db.execute(
                    "UPDATE ef_cases SET status = 'failed' WHERE device_id = ? AND case_id = ?",
                    (row["device_id"], row["case_id"]),
                )
        return found

    def mark_attempt(self, key: CaseKey) -> None:
        """Count one run of the cascade for the case (each should run exactly once)."""
        self.db.execute(
            "UPDATE ef_cases SET attempts = attempts + 1 WHERE device_id = ? AND case_id = ?", key
        )

    def save_verdict(self, verdict: CloudVerdict, *, replica: str) -> bool:
        """Store the verdict once; False if one was already there (a late duplicate)."""
        with self.db.transaction():
            inserted = self.db.execute(
                """INSERT INTO ef_verdicts (device_id, case_id, verdict, model, route,
                    fallback_level, latency_ms, cached, processed_by, created_at)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (device_id, case_id) DO NOTHING""",
                (
                    verdict.device_id,
                    verdict.case_id,
                    verdict.model_dump_json(),
                    verdict.model,
                    verdict.route,
                    verdict.fallback_level,
                    verdict.latency_ms,
                    verdict.cached,
                    replica,
                    utcnow(),
                ),
            )
            self.db.execute(
                "UPDATE ef_cases SET status = 'done', completed_runs = completed_runs + 1 "
                "WHERE device_id = ? AND case_id = ?",
                case_key(verdict),
            )
        return bool(inserted)

    def accounts(self) -> list[dict[str, Any]]:
        """Every case delivered or stored, with its deliveries, runs and whether it has a
        verdict: what an audit of "nothing lost, nothing done twice" reads."""
        cases = self.db.query(
            """SELECT c.case_id, c.device_id, c.status, c.attempts, c.completed_runs,
                      v.case_id IS NOT NULL AS answered
               FROM ef_cases c LEFT JOIN ef_verdicts v
                 ON v.device_id = c.device_id AND v.case_id = c.case_id"""
        )
        counts = self.db.query(
            "SELECT device_id, case_id, COUNT(*) AS n FROM ef_deliveries "
            "GROUP BY device_id, case_id"
        )
        delivered = {(row["device_id"], row["case_id"]): int(row["n"]) for row in counts}
        rows = [
            {
                **row,
                "answered": bool(row["answered"]),
                "deliveries": delivered.pop((row["device_id"], row["case_id"]), 0),
            }
            for row in cases
        ]
        rows += [  # delivered but never stored (refused, or the replica died before the insert)
            {
                "case_id": case_id,
                "device_id": device_id,
                "status": None,
                "attempts": 0,
                "completed_runs": 0,
                "answered": False,
                "deliveries": n,
            }
            for (device_id, case_id), n in delivered.items()
        ]
        return rows

    def owner(self, case_id: CaseId, device_id: str | None = None) -> CaseKey:
        """The key of the case `case_id` of `device_id`; without a device (an operator's
        look-up), of the one device that sent that id. NotFound when there is none (a
        device asking for another's id hears exactly that), Conflict when several
        devices sent it and none is named."""
        if device_id is not None:
            found = self.db.query_one(
                "SELECT device_id FROM ef_cases WHERE device_id = ? AND case_id = ?",
                (device_id, case_id),
            )
            if found is None:
                raise NotFound(f"no case {case_id!r}")
            return (device_id, case_id)
        rows = self.db.query(
            "SELECT device_id FROM ef_cases WHERE case_id = ? ORDER BY device_id LIMIT 11",
            (case_id,),
        )
        if not rows:
            raise NotFound(f"no case {case_id!r}")
        if len(rows) > 1:
            devices = ", ".join(r["device_id"] for r in rows[:10])
            raise Conflict(
                f"case id {case_id!r} was sent by several devices ({devices})",
                code="ambiguous_case_id",
                hint="name the device: ?device=DEVICE",
            )
        return (rows[0]["device_id"], case_id)

    def verdict(self, case_id: CaseId, *, device_id: str | None = None) -> CloudVerdict | None:
        """The case's verdict, if it has one (without a device: the one device's that sent
        that id, Conflict if several did)."""
        if device_id is None:
            try:
                device_id = self.owner(case_id)[0]
            except NotFound:
                return None
        row = self.db.query_one(
            "SELECT verdict FROM ef_verdicts WHERE device_id = ? AND case_id = ?",
            (device_id, case_id),
        )
        return CloudVerdict.model_validate_json(row["verdict"]) if row else None

    def case(self, case_id: CaseId, *, device_id: str | None = None) -> dict[str, Any]:
        """The case record with its verdict and feedback, for GET /v1/escalations/{id}
        (`device_id` as for `owner`)."""
        key = self.owner(case_id, device_id)
        row = self.db.query_one(
            """SELECT case_id, device_id, stream_id, frame_index, reason, trace_id, edge_model,
                      edge_model_version, edge_score, meta, image_sha256, content_type,
                      image_bytes, source, received_at, status, attempts
               FROM ef_cases WHERE device_id = ? AND case_id = ?""",
            key,
        )
        if row is None:
            raise NotFound(f"no case {case_id!r}")
        meta = json.loads(row.pop("meta"))
        verdict = self.verdict(case_id, device_id=key[0])
        feedback = self.db.query(
            """SELECT label, correct, author, principal, received_at FROM ef_feedback
               WHERE device_id = ? AND case_id = ? ORDER BY received_at, id""",
            key,
        )
        return {
            **row,
            "edge_result": meta.get("edge_result", []),
            "verdict": verdict.model_dump(mode="json") if verdict else None,
            "feedback": [{**f, "correct": bool(f["correct"])} for f in feedback],
        }

    def recent_cases(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest cases for the fleet dashboard, each with its verdict (or None while
        pending) and the same-origin URL of its image (operator auth, like the case)."""
        rows = self.db.query(
            f"""SELECT c.case_id, c.device_id, c.reason, c.received_at, v.verdict
                FROM ef_cases c LEFT JOIN ef_verdicts v
                  ON v.device_id = c.device_id AND v.case_id = c.case_id
                ORDER BY c.received_at DESC, c.case_id DESC, c.device_id DESC
                LIMIT {max(0, int(limit))}"""
        )
        out = []
        for row in rows:
            verdict = CloudVerdict.model_validate_json(row["verdict"]) if row["verdict"] else None
            out.append(
                {
                    "case_id": row["case_id"],
                    "device_id": row["device_id"],
                    "ts": _iso_z(row["received_at"]),
                    "reason": row["reason"],
                    "verdict": {
                        "result": [d.model_dump(mode="json") for d in verdict.result],
                        "route": verdict.route,
                    }
                    if verdict
                    else None,
                    "image_url": (
                        f"/v1/escalations/{row['case_id']}/image?device={row['device_id']}"
                    ),
                }
            )
        return out

    def case_image(self, case_id: CaseId, *, device_id: str | None = None) -> tuple[str, Path, str]:
        """(device_id, image path, content type) of a case (`device_id` as for `owner`)."""
        key = self.owner(case_id, device_id)
        row = self.db.query_one(
            "SELECT image_path, content_type FROM ef_cases WHERE device_id = ? AND case_id = ?",
            key,
        )
        if row is None:
            raise NotFound(f"no case {case_id!r}")
        return key[0], Path(row["image_path"]), row["content_type"]

    def case_device(self, case_id: CaseId, *, device_id: str | None = None) -> str | None:
        """The device of the case (`device_id` as for `owner`), None when there is none."""
        try:
            return self.owner(case_id, device_id)[0]
        except NotFound:
            return None

    def attempts(self) -> dict[str, int]:
        rows = self.db.query("SELECT case_id, attempts FROM ef_cases")
        return {r["case_id"]: int(r["attempts"]) for r in rows}

    # --- feedback -------------------------------------------------------------------

    def add_feedback(self, feedback: Feedback, *, principal: str, signature: str) -> None:
        """Feedback on the case `feedback.case_id` of `feedback.device_id`."""
        if self.case_device(feedback.case_id, device_id=feedback.device_id) is None:
            raise NotFound(f"no case {feedback.case_id!r} to give feedback on")
        self.db.execute(
            """INSERT INTO ef_feedback (device_id, case_id, label, correct, author, principal,
                signature, received_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)""",
            (
                feedback.device_id,
                feedback.case_id,
                feedback.label,
                feedback.correct,
                feedback.author,
                principal,
                signature,
                utcnow(),
            ),
        )

    # --- drift ----------------------------------------------------------------------

    def edge_scores(self, since: datetime, until: datetime) -> dict[tuple[str, str], list[float]]:
        """Edge scores per (device, edge model) received in [since, until)."""
        rows = self.db.query(
            """SELECT device_id, edge_model, edge_score FROM ef_cases
               WHERE received_at >= ? AND received_at < ? AND edge_score IS NOT NULL""",
            (since, until),
        )
        out: dict[tuple[str, str], list[float]] = {}
        for r in rows:
            out.setdefault((r["device_id"], r["edge_model"]), []).append(float(r["edge_score"]))
        return out

    # --- health and export ----------------------------------------------------------

    def check_writable(self) -> None:
        """Write one row; raises StoreUnavailable when the store cannot be written."""
        self.db.execute(
            """INSERT INTO ef_health (id, checked_at) VALUES (1, ?)
               ON CONFLICT (id) DO UPDATE SET checked_at = excluded.checked_at""",
            (utcnow(),),
        )

    def count_exportable(self) -> int:
        """Cases `export` scans: those with a verdict or feedback (a rule-based or busy
        verdict without feedback is scanned but gives no example)."""
        row = self.db.query_one(
            f"SELECT COUNT(*) AS n FROM ef_cases c LEFT JOIN ef_verdicts v "
            f"ON v.device_id = c.device_id AND v.case_id = c.case_id WHERE {_CANDIDATE}"
        )
        return int(row["n"]) if row else 0

    def export(
        self, page_size: int = 500, on_scanned: Callable[[], None] | None = None
    ) -> Iterator[ExportRecord]:
        """Every labelled case, oldest first, paged so memory stays flat; `on_scanned` is
        called for each case looked at (a progress bar over `count_exportable`)."""
        after_time: datetime | None = None
        after_id = after_device = ""
        while True:
            params: tuple[Any, ...] = ()
            where = f"WHERE {_CANDIDATE}"
            if after_time is not None:
                where += (
                    " AND (c.received_at > ? OR (c.received_at = ? AND (c.case_id > ?"
                    " OR (c.case_id = ? AND c.device_id > ?))))"
                )
                params = (after_time, after_time, after_id, after_id, after_device)
            rows = self.db.query(
                f"""SELECT c.case_id, c.device_id, c.stream_id, c.image_path, c.content_type,
                           c.meta, c.received_at, v.verdict, v.fallback_level, v.model,
                           (SELECT f.label FROM ef_feedback f
                            WHERE f.device_id = c.device_id AND f.case_id = c.case_id
                            ORDER BY f.received_at DESC, f.id DESC LIMIT 1) AS fb_label,
                           (SELECT f.principal FROM ef_feedback f
                            WHERE f.device_id = c.device_id AND f.case_id = c.case_id
                            ORDER BY f.received_at DESC, f.id DESC LIMIT 1) AS fb_principal
                    FROM ef_cases c LEFT JOIN ef_verdicts v
                      ON v.device_id = c.device_id AND v.case_id = c.case_id
                    {where} ORDER BY c.received_at, c.case_id, c.device_id
                    LIMIT {int(page_size)}""",
                params,
            )
            if not rows:
                return
            for row in rows:
                record = _export_record(row)
                if on_scanned is not None:
                    on_scanned()
                if record is not None:
                    yield record
            last = rows[-1]
            after_time, after_id, after_device = (
                last["received_at"],
                last["case_id"],
                last["device_id"],
            )


# a case with a verdict or feedback (`c` = ef_cases, `v` = its LEFT JOINed verdict)
_CANDIDATE = (
    "(v.case_id IS NOT NULL OR EXISTS (SELECT 1 FROM ef_feedback f0"
    " WHERE f0.device_id = c.device_id AND f0.case_id = c.case_id))"
)


def _export_record(row: dict[str, Any]) -> ExportRecord | None:
    """Label from feedback when there is one, else from a model-made cloud verdict."""
    verdict = CloudVerdict.model_validate_json(row["verdict"]) if row["verdict"] else None
    cloud_result = [d.model_dump(mode="json") for d in verdict.result] if verdict else None
    if row["fb_label"] is not None:
        label, source, by = row["fb_label"], "feedback", row["fb_principal"]
    elif verdict is not None and verdict.fallback_level <= 1 and verdict.result:
        label = " ".join(d.text or d.label or "" for d in verdict.result).strip()
        source, by = "cloud", row["model"]
    else:
        return None
    meta = json.loads(row["meta"])
    return ExportRecord(
        case_id=row["case_id"],
        device_id=row["device_id"],
        stream_id=row["stream_id"],
        image=row["image_path"],
        content_type=row["content_type"],
        label=label,
        label_source=source,
        label_by=by,
        edge_result=meta.get("edge_result", []),
        cloud_result=cloud_result,
        cloud_model=row["model"],
        fallback_level=row["fallback_level"],
        received_at=row["received_at"].isoformat().replace("+00:00", "Z"),
    )
