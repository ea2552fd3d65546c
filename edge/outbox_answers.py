"""Escalations kept beyond their PUBACK until the cloud's verdict: a broker that crashes
between its PUBACK and its delivery to the cloud loses what it held in memory, so an
acknowledged case still unanswered after a while is put back in line (the cloud is
idempotent by case id), at most `max_resends` times, then dropped and counted."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from typing import Any

from prometheus_client import Counter

from edgefleet.edge.outbox_tally import PRIORITY, UNANSWERED, Tally

log = logging.getLogger(__name__)

RESENT_UNANSWERED = Counter(
    "ef_edge_outbox_unanswered_resent_total", "Acknowledged escalations sent again, unanswered"
)

# How long an answered case is remembered: a copy of it sent again just before the verdict
# may still be acknowledged after it (and must not wait for a second verdict).
ANSWERED_KEEP_S = 24 * 3600


class AnswerWait:
    """The `awaiting` and `answered` tables of the outbox's file, under the outbox's lock."""

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock, tally: Tally) -> None:
        self._db = db
        self._lock = lock
        self._tally = tally

    def keep(self, row: tuple[Any, ...]) -> None:
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
            self._tally.publish()
        return cur.rowcount > 0

    def resend(self, older_than_s: float, max_resends: int) -> int:
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
                        self._tally.drop(UNANSWERED)
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
                    self._tally.added(int(size))
                    again += 1
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._tally.publish()
        if again:
            RESENT_UNANSWERED.inc(again)
            log.warning(
                "%d acknowledged case(s) unanswered after %.0f s: sent again", again, older_than_s
            )
        return again

    def waiting(self) -> int:
        """Escalations the broker acknowledged and the cloud has not answered yet."""
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM awaiting").fetchone()[0])
