"""Reading cases back: one case with its verdict and feedback, the newest for the
dashboard, a case's image, and the edge's scores over a window (drift).

A case id is its device's own: without a device (an operator's look-up) a case is found
by the one device that sent that id, and several such devices are a `Conflict`.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edgefleet.shared.db import Database
from edgefleet.shared.errors import Conflict, NotFound
from edgefleet.shared.messages import CaseId, CloudVerdict, EscalationCase

CaseKey = tuple[str, CaseId]  # (device_id, case_id): a case id is its device's own


def case_key(case: EscalationCase | CloudVerdict) -> CaseKey:
    return (case.device_id, case.case_id)


def _iso_z(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


class CaseLookup:
    def __init__(self, db: Database):
        self.db = db

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
