"""The fleet event log keeps its newest lines only (a bounded history)."""

from __future__ import annotations

from pathlib import Path

from edgefleet.fleet.events import EventLog, FleetEventIn
from edgefleet.shared.db import Database


def test_the_event_log_keeps_only_its_newest_lines(tmp_path: Path) -> None:
    # given a log that keeps 5 lines
    log = EventLog(Database.connect(f"sqlite:///{tmp_path / 'fleet.db'}"), keep=5)
    # when 12 are posted
    for n in range(12):
        log.add(FleetEventIn(source="test", component="broker", message=f"line {n}"))
    # then the 5 newest remain, oldest first
    assert [e.message for e in log.recent(limit=50)] == [f"line {n}" for n in range(7, 12)]
