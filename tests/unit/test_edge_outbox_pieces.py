"""The outbox's pieces through their own constructors: the file, the tally, the wait for
answers (the Outbox itself composes them: tests/unit/test_edge_outbox.py)."""

from __future__ import annotations

import threading
from pathlib import Path

from edgefleet.edge.outbox_answers import AnswerWait
from edgefleet.edge.outbox_file import open_file
from edgefleet.edge.outbox_tally import UNANSWERED, Tally


def _tables(db) -> set[str]:
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_a_fresh_file_has_its_tables_and_a_telemetry_seq_from_the_clock(tmp_path: Path) -> None:
    db, recovered = open_file(tmp_path / "o.db", "full")
    assert recovered is None
    assert {"messages", "counters", "awaiting", "answered"} <= _tables(db)
    (seq,) = db.execute("SELECT value FROM counters WHERE name = 'telemetry_seq'").fetchone()
    assert seq > 1_600_000_000_000  # milliseconds of the wall clock, not 0
    db.close()


def test_a_corrupt_file_is_moved_aside_and_a_fresh_one_opened(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4096)
    db, recovered = open_file(path, "normal")
    assert (
        recovered is not None and recovered.exists() and recovered.name.startswith("o.db.corrupt-")
    )
    assert db.execute("SELECT count(*) FROM messages").fetchone() == (0,)
    db.close()


def _row(db, size: int) -> None:
    db.execute(
        "INSERT INTO messages (kind, priority, schema, body, qos, retain, size, created) "
        "VALUES ('telemetry', 0, 'ef.telemetry/1', x'00', 0, 0, ?, 0)",
        (size,),
    )


def test_the_tally_reads_the_file_once_and_persists_its_drops(tmp_path: Path) -> None:
    db, _ = open_file(tmp_path / "o.db", "normal")
    _row(db, 10)
    _row(db, 30)
    tally = Tally(db)
    assert (tally.count, tally.bytes) == (2, 40)
    tally.removed(10)
    tally.added(5)
    tally.drop("telemetry")
    tally.drop(UNANSWERED)
    assert (tally.count, tally.bytes) == (2, 35)
    again = Tally(db)  # a restart reads the drops back, not the in-memory changes
    assert again.dropped == {"telemetry": 1, "reported": 0, "escalation": 0, UNANSWERED: 1}
    assert (again.count, again.bytes) == (2, 40)
    db.close()


def test_the_wait_keeps_a_case_until_its_answer_and_puts_it_back_in_line(tmp_path: Path) -> None:
    db, _ = open_file(tmp_path / "o.db", "normal")
    tally = Tally(db)
    wait = AnswerWait(db, threading.Lock(), tally)
    body = b'{"case_id": "c-1"}'
    # (kind, size, schema, body, image, content_type, qos, created): the ack's RETURNING row
    wait.keep(("escalation", 20, "ef.escalation/2", body, b"\xff\xd8", "image/jpeg", 1, 0.0))
    wait.keep(("escalation", 9, "ef.escalation/2", b"not json", None, None, 1, 0.0))
    assert wait.waiting() == 1  # a body without a case id cannot be matched to a verdict
    assert wait.resend(older_than_s=0, max_resends=1) == 1
    assert tally.count == 1 and tally.bytes == 20
    (schema, image) = db.execute("SELECT schema, image FROM messages").fetchone()
    assert (schema, bytes(image)) == ("ef.escalation/2", b"\xff\xd8")
    assert wait.resend(older_than_s=0, max_resends=1) == 0  # sent once already: dropped
    assert tally.dropped[UNANSWERED] == 1 and wait.waiting() == 0
    assert wait.answered("c-1") is False  # nothing left to wait for
    db.close()
