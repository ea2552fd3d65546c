"""An agent upgraded over an existing state folder sends the cases its predecessor queued."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

from edgefleet.bench.mosquitto import MosquittoBroker
from edgefleet.edge.agent import Agent
from edgefleet.shared.messages import EscalationCase, ModelInfo, utcnow
from edgefleet.shared.topics import Topics
from tests.support.edge import DEVICE, Collector, build_settings, edge_settings
from tests.support.outbox import OLD_SCHEMA
from tests.support.waiting import eventually

JPEG = b"\xff\xd8\xff\xe0" + bytes(256)


def test_cases_queued_by_the_previous_agent_are_delivered_after_the_upgrade(
    broker: MosquittoBroker, tmp_path: Path
) -> None:
    # given the outbox file of the previous agent, two cases still queued in it, one made
    # and stored a day ago (the device was off since: the cloud refuses a day-old ts)
    day_ago = utcnow() - timedelta(days=1)
    cases = [
        EscalationCase(
            device_id=DEVICE,
            ts=day_ago if i == 0 else utcnow(),
            stream_id="gate",
            frame_index=i,
            reason="unsure",
            model=ModelInfo(name="ppocr", version="4"),
            content_type="image/jpeg",
        )
        for i in range(2)
    ]
    db = sqlite3.connect(tmp_path / "outbox.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(OLD_SCHEMA)
    for case in cases:
        meta = case.model_dump_json().encode()
        db.execute(
            "INSERT INTO messages (kind, priority, topic, body, image, qos, retain, size, created) "
            "VALUES ('escalation', 2, ?, ?, ?, 1, 0, ?, ?)",
            (Topics().escalations(DEVICE), meta, JPEG, len(meta) + len(JPEG), case.ts.timestamp()),
        )
    db.close()
    collector = Collector(broker, "cloud-upgrade")
    # when the new agent starts over the same state folder
    agent = Agent(build_settings(edge_settings(tmp_path, broker, "unused", streams=[])))
    agent.start()
    try:
        # then both cases arrive as they were made (the old one restamped), with their images,
        # and leave the outbox
        eventually(lambda: len(collector.cases) == 2, 60, "the queued cases")
        eventually(lambda: agent.outbox.depth("escalation") == 0, 30, "their PUBACKs")
    finally:
        agent.stop()
        collector.close()
    received = {cid: got.model_dump(exclude={"ts"}) for cid, (got, _) in collector.cases.items()}
    assert received == {c.case_id: c.model_dump(exclude={"ts"}) for c in cases}
    assert {image for _, image in collector.cases.values()} == {JPEG}
    assert collector.rejected == []
