"""Closing a SQLite store while another thread queries it: the query finishes or is told
the store is gone (StoreUnavailable), and the process does not crash."""

from __future__ import annotations

import threading
from pathlib import Path

from edgefleet.shared.db import Database, StoreUnavailable

SLOW = (
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) "
    "SELECT count(*) AS c FROM n"
)


def test_a_store_closed_under_a_running_query_refuses_it_instead_of_crashing(
    tmp_path: Path,
) -> None:
    db = Database.connect(f"sqlite:///{tmp_path / 'store.db'}")
    started = threading.Event()
    outcome: list[str] = []

    def query() -> None:
        try:
            while True:
                db.query(SLOW)
                started.set()
        except StoreUnavailable:
            outcome.append("refused")

    worker = threading.Thread(target=query, daemon=True)
    worker.start()
    assert started.wait(30)
    db.close()
    worker.join(30)
    assert outcome == ["refused"]
