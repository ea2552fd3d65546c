"""The demo's ledger: the agents' records against the cloud's store, case by case."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from edgefleet.demo.ledger import build_ledger, outbox_case_ids


def _account(case_id: str, **over: object) -> dict[str, object]:
    row: dict[str, object] = {
        "case_id": case_id,
        "device_id": "cam-1",
        "status": "done",
        "attempts": 1,
        "completed_runs": 1,
        "answered": True,
        "deliveries": 1,
    }
    return row | over


def _rows(made: list[str], answered: list[str]) -> list[dict[str, object]]:
    return [{"kind": "escalated", "case_id": c} for c in made] + [
        {"kind": "verdict", "case_id": c} for c in answered
    ]


def test_every_case_round_trip_is_zero_loss_with_duplicates_told_apart() -> None:
    # given two devices whose cases all came back; one case delivered twice (a resend after
    # a broker restart) and one re-run after a crash cut its first run short
    rows = {"cam-1": _rows(["a", "b"], ["a", "b", "b"]), "cam-2": _rows(["c"], ["c"])}
    accounts = [
        _account("a", deliveries=2),
        _account("b", attempts=2),
        _account("c", device_id="cam-2"),
    ]
    ledger = build_ledger(rows, accounts)
    assert (ledger.created, ledger.delivered, ledger.stored, ledger.answered) == (3, 3, 3, 3)
    assert ledger.received == 3 and ledger.lost == 0 and ledger.missing == []
    assert ledger.duplicates_delivered == 1
    assert ledger.duplicates_processed == 0
    assert ledger.reruns_after_crash == 1
    assert ledger.answers_received_twice == 1
    assert ledger.verdict_lines()[0].startswith("lost = 0, duplicates processed = 0, 3 of 3")


def test_a_verdict_computed_twice_is_a_duplicate_processed() -> None:
    ledger = build_ledger({"cam-1": _rows(["a"], ["a"])}, [_account("a", completed_runs=2)])
    assert ledger.duplicates_processed == 1 and ledger.lost == 0


def test_each_missing_case_says_where_it_stopped() -> None:
    made = ["in-outbox", "vanished", "not-stored", "pending", "unheard", "ok"]
    rows = {"cam-1": _rows(made, ["ok"])}
    accounts = [
        _account("not-stored", status=None, device_id=None, answered=False, completed_runs=0),
        _account("pending", status="pending", answered=False, completed_runs=0),
        _account("unheard"),
        _account("ok"),
        _account("someone-else", device_id="cam-9"),
    ]
    ledger = build_ledger(rows, accounts, {"cam-1": {"in-outbox"}})
    stopped = {m.case_id: m.stopped for m in ledger.missing}
    assert ledger.lost == 5
    assert "still in the device's outbox" in stopped["in-outbox"]
    assert "never reached the cloud" in stopped["vanished"]
    assert "delivered to the cloud but not stored" in stopped["not-stored"]
    assert "stored but not answered (status pending)" in stopped["pending"]
    assert "the answer never reached the device" in stopped["unheard"]
    assert ledger.unknown_to_devices == 1
    lines = ledger.verdict_lines()
    assert lines[0].startswith("lost = 5") and any("missing vanished (cam-1)" in x for x in lines)


def test_the_outbox_is_read_for_the_escalations_still_in_it(tmp_path: Path) -> None:
    outbox = tmp_path / "outbox.db"
    with sqlite3.connect(outbox) as db:
        db.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, kind TEXT, body BLOB)")
        db.execute(
            "INSERT INTO messages (kind, body) VALUES ('escalation', ?), ('telemetry', ?)",
            (b'{"case_id": "x1"}', b'{"seq": 1}'),
        )
    assert outbox_case_ids(outbox) == {"x1"}
    assert outbox_case_ids(tmp_path / "missing.db") == set()
