"""The disk outbox: durable puts, removal on ack, bounds with a drop policy, recovery."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from edgefleet.edge.outbox import Outbox
from edgefleet.edge.outbox_tally import OutboxKind
from edgefleet.shared.errors import ConfigError, EdgefleetError
from edgefleet.shared.wire import Serialised

JPEG = b"\xff\xd8\xff"
SCHEMA: dict[OutboxKind, str] = {
    "telemetry": "ef.telemetry/1",
    "reported": "ef.reported/1",
    "escalation": "ef.escalation/2",
}


def _message(kind: OutboxKind, body: bytes = b"x" * 100) -> Serialised:
    """A stored message of `kind` (the outbox keeps bytes; it does not parse them)."""
    if kind == "escalation":
        return Serialised(SCHEMA[kind], body, JPEG, "image/jpeg")
    return Serialised(SCHEMA[kind], body)


def _put(box: Outbox, kind: OutboxKind, n: int, size: int = 100) -> list[int]:
    return [box.put(_message(kind, b"x" * size)) for _ in range(n)]


def test_messages_survive_reopen_and_leave_only_on_ack(tmp_path: Path) -> None:
    # given an outbox with three messages
    box = Outbox(tmp_path / "o.db")
    ids = _put(box, "escalation", 3)
    box.put(_message("telemetry", b"tel"), qos=0)
    box.close()
    # when it is reopened (as after a crash) and one is acknowledged
    box = Outbox(tmp_path / "o.db")
    assert box.depth() == 4
    assert box.ack([ids[1], 999_999]) == 1
    # then the others are still there, in order, with their properties
    items = box.read(0)
    assert [i.id for i in items] == [ids[0], ids[2], ids[2] + 1]
    assert items[-1].qos == 0 and items[-1].kind == "telemetry"
    assert items[-1].message == Serialised("ef.telemetry/1", b"tel")
    assert items[0].message == _message("escalation")
    assert box.read(ids[0], up_to_id=ids[2]) == [items[1]]
    assert box.depth("escalation") == 2


def test_wal_mode_and_synchronous_policy(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db", synchronous="full")
    assert box._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert box._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    normal = Outbox(tmp_path / "n.db", synchronous="normal")
    assert normal._db.execute("PRAGMA synchronous").fetchone()[0] == 1


def test_full_outbox_drops_telemetry_first_and_escalations_last(tmp_path: Path) -> None:
    # given a full outbox of 2 escalations, 1 reported and 2 telemetry messages
    box = Outbox(tmp_path / "o.db", max_messages=10)
    box.max_messages = 5
    esc = _put(box, "escalation", 2)
    rep = _put(box, "reported", 1)
    tel = _put(box, "telemetry", 2)
    # when three more escalations arrive
    new = _put(box, "escalation", 3)
    # then the two telemetry messages went first, then the reported one
    remaining = [i.id for i in box.read(0)]
    assert remaining == esc + new
    assert box.dropped == {"telemetry": 2, "reported": 1, "escalation": 0}
    assert not set(tel + rep) & set(remaining)
    # when telemetry arrives into an outbox full of escalations, the newcomer is dropped
    assert box.put(_message("telemetry")) == 0
    assert box.dropped["telemetry"] == 3
    # and when escalations keep coming, the oldest escalation makes room
    later = _put(box, "escalation", 1)
    assert [i.id for i in box.read(0)] == [esc[1], *new, *later]
    assert box.dropped_total == 5


def test_byte_bound_is_enforced(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db", max_bytes=64 * 1024)
    _put(box, "escalation", 10, size=10_000)
    assert box.size_bytes <= 64 * 1024
    assert box.depth() == 6
    assert box.dropped["escalation"] == 4


def test_drop_counters_persist(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db", max_messages=10)
    _put(box, "telemetry", 12)
    box.close()
    assert Outbox(tmp_path / "o.db").dropped["telemetry"] == 2


def test_telemetry_seq_never_repeats_across_restarts(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    first = [box.next_seq() for _ in range(3)]
    box.close()
    box = Outbox(tmp_path / "o.db")
    second = box.next_seq()
    assert first == sorted(first) and len(set(first)) == 3
    assert second == first[-1] + 1


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_outbox_is_moved_aside_and_a_fresh_one_starts(tmp_path: Path, damage: str) -> None:
    # given an outbox file that is not a database any more
    path = tmp_path / "o.db"
    box = Outbox(path)
    _put(box, "escalation", 50, size=2000)
    seq_before = box.next_seq()
    box.checkpoint()
    box.close()
    data = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"this is not sqlite" * 100)
    else:
        path.write_bytes(data[:100] + b"\0" * 4096 + data[5000:8000])
    # when the agent opens it
    box = Outbox(path)
    # then the damaged file is kept aside, the new outbox works and seq does not repeat
    assert box.recovered_from is not None and box.recovered_from.exists()
    assert box.depth() == 0
    assert box.put(_message("escalation")) > 0
    assert box.writable()
    assert box.next_seq() > seq_before


def test_a_message_that_does_not_go_through_the_outbox_is_refused(tmp_path: Path) -> None:
    # status is published directly (its last will covers the gap), verdicts come in
    for schema in ("ef.status/1", "ef.verdict/2", "ef.nothing/1"):
        with pytest.raises(ValueError):
            Outbox(tmp_path / "o.db").put(Serialised(schema, b"{}"))


def test_outbox_file_is_plain_sqlite(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    _put(box, "escalation", 2)
    db = sqlite3.connect(tmp_path / "o.db")
    assert db.execute("SELECT count(*) FROM messages").fetchone()[0] == 2


def test_a_directory_as_outbox_path_is_refused_and_left_alone(tmp_path: Path) -> None:
    # given an outbox path that names a folder with files in it
    folder = tmp_path / "volume"
    (folder / "keep").mkdir(parents=True)
    (folder / "keep" / "data").write_text("precious")
    # when an outbox is opened there, then it is a config error and nothing is moved
    with pytest.raises(ConfigError, match="not a file"):
        Outbox(folder)
    assert (folder / "keep" / "data").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["volume"]


def test_an_outbox_locked_by_another_process_is_not_mistaken_for_a_corrupt_one(
    tmp_path: Path,
) -> None:
    # given a good outbox with a message, held exclusively by another connection
    path = tmp_path / "o.db"
    box = Outbox(path)
    box.put(_message("escalation", b"keep me"))
    box.close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode=DELETE")
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        # when the agent opens it, then it says why and leaves the file where it is
        with pytest.raises(EdgefleetError, match="cannot open the outbox") as err:
            Outbox(path)
        assert "no other agent" in err.value.hint
        assert sorted(p.name for p in tmp_path.iterdir()) == ["o.db"]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    # and once the other process is gone the message is still there
    assert [item.message.json for item in Outbox(path).read(0)] == [b"keep me"]


def test_outbox_and_store_files_are_private(tmp_path: Path) -> None:
    import os
    import stat

    from edgefleet.shared.db import Database

    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    old = os.umask(0o022)  # a usual umask: it must not decide who reads the data
    try:
        box = Outbox(tmp_path / "edge" / "outbox.db")
        box.put(_message("telemetry", b"{}"))
        db = Database.connect(f"sqlite:///{tmp_path / 'cloud' / 'cloud.db'}")
        db.execute("CREATE TABLE t (x INTEGER)")
        # an outbox created 0644 by an older version is tightened when opened
        legacy = tmp_path / "legacy" / "outbox.db"
        legacy.parent.mkdir()
        legacy.touch(mode=0o644)
        Outbox(legacy).close()
    finally:
        os.umask(old)
    for folder in (tmp_path / "edge", tmp_path / "cloud"):
        assert mode(folder) == 0o700, folder
    for file in (*(tmp_path / "edge").iterdir(), *(tmp_path / "cloud").iterdir(), legacy):
        assert mode(file) & 0o077 == 0, file
    box.close()
    db.close()


def test_an_acknowledged_case_is_kept_until_answered_and_sent_again_if_not(
    tmp_path: Path,
) -> None:
    # given two cases and a telemetry message, all acknowledged by the broker
    box = Outbox(tmp_path / "o.db")
    answered = box.put(_message("escalation", b'{"case_id": "c-1"}'))
    lost = box.put(_message("escalation", b'{"case_id": "c-2"}'))
    tel = box.put(_message("telemetry", b'{"seq": 1}'))
    box.ack([answered, lost, tel])
    assert box.depth() == 0 and box.answers.waiting() == 2  # the cases wait for their answer
    # when one answer arrives and the other case's broker crashed after its PUBACK
    assert box.answers.answered("c-1") is True
    assert box.answers.answered("c-1") is False
    box.close()
    box = Outbox(tmp_path / "o.db")  # (an agent restart keeps what waits)
    # then nothing goes back before `older_than_s`, the unanswered one after it
    assert box.answers.resend(older_than_s=3600, max_resends=2) == 0
    assert box.answers.resend(older_than_s=0, max_resends=2) == 1
    again = box.read(0)
    assert [(i.kind, i.message) for i in again] == [
        ("escalation", _message("escalation", b'{"case_id": "c-2"}'))
    ]
    # and after `max_resends` unanswered sends the copy is dropped and counted
    box.ack([again[0].id])
    assert box.answers.resend(older_than_s=0, max_resends=2) == 1
    box.ack([box.read(again[0].id)[0].id])
    assert box.answers.resend(older_than_s=0, max_resends=2) == 0
    assert box.answers.waiting() == 0 and box.depth() == 0
    assert box.dropped["escalation_unanswered"] == 1
    box.close()
    assert Outbox(tmp_path / "o.db").dropped["escalation_unanswered"] == 1


def test_a_copy_acknowledged_after_its_verdict_does_not_wait_again(tmp_path: Path) -> None:
    # given a case acknowledged, unanswered for a while, and sent again
    box = Outbox(tmp_path / "o.db")
    box.ack([box.put(_message("escalation", b'{"case_id": "c-1"}'))])
    assert box.answers.resend(older_than_s=0, max_resends=3) == 1
    (copy,) = box.read(0)
    # when the verdict arrives while the copy is still in line, then the copy's PUBACK
    assert box.answers.answered("c-1") is True
    box.ack([copy.id])
    # then nothing waits for a second verdict, and nothing is sent a third time
    assert box.answers.waiting() == 0 and box.depth() == 0
    assert box.answers.resend(older_than_s=0, max_resends=3) == 0
    box.close()
