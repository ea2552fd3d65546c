"""An agent upgraded over an existing state folder keeps what its older outbox had queued.

The older outbox stored (kind, topic, JSON, image) rows; the file is rewritten in place
as typed rows when it is opened, and each migrated message goes out signed exactly as the
older agent would have sent it.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from edgefleet.edge.outbox import Outbox
from edgefleet.shared.messages import (
    DeviceTelemetry,
    EscalationCase,
    EscalationCounters,
    ModelInfo,
    ReportedState,
)
from edgefleet.shared.topics import Channel, Topics
from edgefleet.shared.wire import encode, serialise, sign
from tests.support.outbox import OLD_SCHEMA

KEY = b"k" * 32
TOPICS = Topics()
JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 64


CASE = EscalationCase(
    device_id="cam-01",
    stream_id="gate",
    frame_index=7,
    reason="unsure",
    model=ModelInfo(name="ppocr", version="4"),
    content_type="image/jpeg",
)


TELEMETRY = DeviceTelemetry(
    device_id="cam-01",
    seq=41,
    uptime_s=1.0,
    escalations=EscalationCounters(sent=0, pending=1, dropped=0),
    outbox_depth=1,
    cpu_pct=1.0,
    ram_used_mb=1.0,
)
REPORTED = ReportedState(device_id="cam-01", deployment_id="d1", image="edge:1", status="healthy")


def _old_outbox(path: Path, *, extra_rows: tuple[tuple[str, bytes], ...] = ()) -> dict[str, int]:
    """An outbox file as the older agent left it: three queued messages (ids 3, 5 and 6;
    ids up to 9 were used), two telemetry drops counted. Returns kind -> id."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(OLD_SCHEMA)
    rows = [
        (
            3,
            "escalation",
            2,
            TOPICS.escalations("cam-01"),
            CASE.model_dump_json().encode(),
            JPEG,
        ),
        (
            5,
            "telemetry",
            0,
            TOPICS.telemetry("cam-01"),
            TELEMETRY.model_dump_json().encode(),
            None,
        ),
        (6, "reported", 1, TOPICS.reported("cam-01"), REPORTED.model_dump_json().encode(), None),
    ]
    rows += [(8 + i, kind, 0, "t", body, None) for i, (kind, body) in enumerate(extra_rows)]
    for id_, kind, priority, topic, body, image in rows:
        db.execute(
            "INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, 1700000000.0)",
            (id_, kind, priority, topic, body, image, int(kind == "reported"), len(body)),
        )
    db.execute("UPDATE sqlite_sequence SET seq = 9 WHERE name = 'messages'")
    db.execute("INSERT INTO counters VALUES ('dropped_telemetry', 2), ('telemetry_seq', 40)")
    db.close()
    return {kind: id_ for id_, kind, *_ in rows[:3]}


def test_queued_messages_of_an_older_outbox_are_kept_and_sent_as_before(tmp_path: Path) -> None:
    # given the outbox file of an older agent with a case, telemetry and a report queued
    path = tmp_path / "outbox.db"
    ids = _old_outbox(path)
    # when the upgraded agent opens it
    box = Outbox(path)
    # then every queued message is still there, in order, with its id, kind and options
    items = box.read(0)
    assert [(i.id, i.kind, i.channel) for i in items] == [
        (ids["escalation"], "escalation", Channel.ESCALATIONS),
        (ids["telemetry"], "telemetry", Channel.TELEMETRY),
        (ids["reported"], "reported", Channel.REPORTED),
    ]
    assert [i.retain for i in items] == [False, False, True]
    assert box.depth() == 3 and box.depth("escalation") == 1
    assert box.dropped["telemetry"] == 2 and box.next_seq() == 41
    # and each goes out signed exactly as the older agent would have sent it
    case_item, telemetry_item, reported_item = items
    assert case_item.message.content_type == "image/jpeg" and case_item.message.image == JPEG
    assert sign(case_item.message, KEY, TOPICS.escalations("cam-01")) == encode(
        CASE, KEY, TOPICS.escalations("cam-01"), JPEG
    )
    assert sign(telemetry_item.message, KEY, TOPICS.telemetry("cam-01")) == encode(
        TELEMETRY, KEY, TOPICS.telemetry("cam-01")
    )
    assert sign(reported_item.message, KEY, TOPICS.reported("cam-01")) == encode(
        REPORTED, KEY, TOPICS.reported("cam-01")
    )
    # and a new message never reuses an id the older agent had handed out
    assert box.put(serialise(TELEMETRY)) > 9
    box.close()
    # and opening it again changes nothing
    assert [i.id for i in Outbox(path).read(0)] == [3, 5, 6, 10]


def test_a_row_that_is_not_a_message_is_logged_and_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # given an older outbox with one row that no agent could ever send
    path = tmp_path / "outbox.db"
    _old_outbox(path, extra_rows=(("telemetry", b"not json"),))
    # when it is migrated, then the good rows are kept and the bad one is named in the log
    with caplog.at_level(logging.ERROR, logger="edgefleet.edge.outbox"):
        box = Outbox(path)
    assert [i.id for i in box.read(0)] == [3, 5, 6]
    assert "outbox row 8 is not a message" in caplog.text
