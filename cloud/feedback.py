"""Signed feedback on cases, and the export of every labelled case as training examples
(the label from feedback when there is one, else from a model-made cloud verdict)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from edgefleet.cloud.lookup import CaseLookup
from edgefleet.shared.db import Database
from edgefleet.shared.errors import NotFound
from edgefleet.shared.messages import CaseId, CloudVerdict, Feedback, ImageContentType, utcnow


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


class FeedbackLog:
    def __init__(self, db: Database, lookup: CaseLookup):
        self.db = db
        self.lookup = lookup

    def add(self, feedback: Feedback, *, principal: str, signature: str) -> None:
        """Feedback on the case `feedback.case_id` of `feedback.device_id`."""
        if self.lookup.case_device(feedback.case_id, device_id=feedback.device_id) is None:
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
