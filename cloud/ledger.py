"""The case ledger: each case recorded once with its image, each copy that arrives noted
(a delivery), each run counted, each verdict stored once.

Idempotency across replicas is a row claim: the first replica to insert a case owns it;
a replica that finds the case already there answers from its verdict, or waits for the
owner, or takes the case over when the owner's claim is older than `stale_after_s`.
"""

from __future__ import annotations

import enum
import logging
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from edgefleet.cloud.images import ImageStore
from edgefleet.cloud.lookup import CaseKey, CaseLookup, case_key
from edgefleet.shared.db import Database
from edgefleet.shared.messages import CaseId, CloudVerdict, EscalationCase, Sha256, utcnow

log = logging.getLogger(__name__)


class ClaimState(str, enum.Enum):
    CLAIMED = "claimed"  # this replica owns the case: run it
    DONE = "done"  # a verdict exists: answer with it
    IN_PROGRESS = "in_progress"  # another worker owns it: wait for its verdict


@dataclass(frozen=True)
class Claim:
    state: ClaimState
    verdict: CloudVerdict | None = None


def _edge_score(case: EscalationCase) -> float | None:
    """The edge's confidence in its own answer: the lowest line score (None if no lines)."""
    return min((d.score for d in case.edge_result), default=None)


class CaseLedger:
    def __init__(self, db: Database, images: ImageStore, lookup: CaseLookup):
        self.db = db
        self.images = images
        self.lookup = lookup

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
        path = self.images.path(image_sha256, case.content_type)
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
                self.images.put(image_sha256, case.content_type, image)
                return Claim(ClaimState.CLAIMED)
            verdict = self.lookup.verdict(case.case_id, device_id=case.device_id)
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
            verdict = self.lookup.verdict(case.case_id, device_id=case.device_id)
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

    def attempts(self) -> dict[str, int]:
        rows = self.db.query("SELECT case_id, attempts FROM ef_cases")
        return {r["case_id"]: int(r["attempts"]) for r in rows}

    def check_writable(self) -> None:
        """Write one row; raises StoreUnavailable when the store cannot be written."""
        self.db.execute(
            """INSERT INTO ef_health (id, checked_at) VALUES (1, ?)
               ON CONFLICT (id) DO UPDATE SET checked_at = excluded.checked_at""",
            (utcnow(),),
        )
