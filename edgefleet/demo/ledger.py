"""The demo's ledger: every case followed from the device that made it to the answer back.

Two independent records, so that one bug cannot hide in both: the agents' own files
(edgefleet.demo.agent writes `escalated` once a case is safely in the outbox and `verdict`
when an answer arrives) and the cloud's store (`CaseStore.accounts`: deliveries,
stored cases, completed cascade runs, verdicts). A case missing an answer on its device is
reported with the last place it was seen: still in the device's outbox, sent but never
delivered, delivered but not stored, stored but not answered, or answered but the answer
never reached the device.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table


@dataclass(frozen=True)
class Missing:
    case_id: str
    device_id: str
    stopped: str  # where it was last seen


@dataclass
class Ledger:
    created: int = 0  # cases the devices put in their outboxes (their own record)
    delivered: int = 0  # of those, cases that reached a cloud replica at least once
    stored: int = 0  # distinct cases in the store
    answered: int = 0  # cases with a verdict in the store
    received: int = 0  # cases whose answer the device recorded
    duplicates_delivered: int = 0  # extra copies that reached the cloud
    duplicates_processed: int = 0  # extra completed cascade runs (a verdict computed twice)
    reruns_after_crash: int = 0  # runs cut short by a crash and run again (not duplicates)
    answers_received_twice: int = 0  # a device recorded the same answer more than once
    unknown_to_devices: int = 0  # stored cases no device recorded (made just before a kill)
    missing: list[Missing] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return len(self.missing)

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"lost": self.lost}

    def table(self) -> Table:
        table = Table(title="ledger (devices' records ⟷ cloud store)", title_justify="left")
        table.add_column("cases", justify="left")
        table.add_column("count", justify="right")
        rows = [
            ("created on the devices", self.created),
            ("delivered to the cloud", self.delivered),
            ("stored (distinct)", self.stored),
            ("answered", self.answered),
            ("answers received by the devices", self.received),
            ("duplicates delivered", self.duplicates_delivered),
            ("duplicates processed", self.duplicates_processed),
            ("re-run after a crash (first run cut short)", self.reruns_after_crash),
            ("lost", self.lost),
        ]
        for label, value in rows:
            style = "red" if label in ("lost", "duplicates processed") and value else None
            table.add_row(label, f"{value:,}", style=style)
        return table

    def verdict_lines(self) -> list[str]:
        lines = [
            f"lost = {self.lost}, duplicates processed = {self.duplicates_processed}, "
            f"{self.received} of {self.created} cases answered on their devices"
        ]
        lines += [f"  missing {m.case_id} ({m.device_id}): {m.stopped}" for m in self.missing]
        return lines


def build_ledger(
    device_rows: dict[str, list[dict[str, Any]]],
    accounts: list[dict[str, Any]],
    in_outbox: dict[str, set[str]] | None = None,
) -> Ledger:
    """The ledger from each device's rows (device id → its results rows), the store's
    accounts (CaseStore.accounts) and the case ids still in each device's outbox."""
    in_outbox = in_outbox or {}
    store = {row["case_id"]: row for row in accounts}
    created: dict[str, str] = {}
    received: Counter[str] = Counter()
    for device_id, rows in device_rows.items():
        for row in rows:
            if row.get("kind") == "escalated":
                created.setdefault(row["case_id"], device_id)
            elif row.get("kind") == "verdict":
                received[row["case_id"]] += 1
    ledger = Ledger(created=len(created))
    for case_id, device_id in sorted(created.items()):
        account = store.get(case_id)
        delivered = bool(account and account["deliveries"] > 0)
        stored = bool(account and account["status"] is not None)
        answered = bool(account and account["answered"])
        ledger.delivered += delivered
        ledger.stored += stored
        ledger.answered += answered
        ledger.received += case_id in received
        if case_id in received:
            continue
        if case_id in in_outbox.get(device_id, set()):
            stopped = "still in the device's outbox (never acknowledged by the broker)"
        elif not delivered and not stored:
            stopped = "left the device's outbox but never reached the cloud"
        elif not stored:
            stopped = "delivered to the cloud but not stored"
        elif not answered:
            stopped = f"stored but not answered (status {account['status'] if account else '?'})"
        else:
            stopped = "answered in the store but the answer never reached the device"
        ledger.missing.append(Missing(case_id, device_id, stopped))
    for case_id, row in store.items():
        ledger.duplicates_delivered += max(0, row["deliveries"] - 1)
        ledger.duplicates_processed += max(0, row["completed_runs"] - 1)
        ledger.reruns_after_crash += max(0, row["attempts"] - max(1, row["completed_runs"]))
        if row["status"] is not None and case_id not in created:
            ledger.unknown_to_devices += 1
    ledger.answers_received_twice = sum(1 for n in received.values() if n > 1)
    return ledger


def outbox_case_ids(outbox: Path) -> set[str]:
    """Case ids of the escalations still waiting in an agent's outbox (its SQLite file)."""
    found: set[str] = set()
    try:
        with contextlib.closing(sqlite3.connect(f"file:{outbox}?mode=ro", uri=True)) as db:
            rows = db.execute("SELECT body FROM messages WHERE kind = 'escalation'").fetchall()
    except sqlite3.Error:
        return found
    for (body,) in rows:
        with contextlib.suppress(ValueError, AttributeError):
            found.add(str(json.loads(body)["case_id"]))
    return found
