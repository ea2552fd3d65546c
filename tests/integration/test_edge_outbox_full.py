"""The whole agent with a corrupt outbox file and no broker: it starts anyway, reports the
file it moved aside, fills its small outbox, drops telemetry before escalations and the
oldest escalations first, and counts every drop in its telemetry."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from edgefleet.edge.agent import Agent
from edgefleet.edge.outbox import Outbox, OutboxItem
from edgefleet.shared.messages import EscalationCase
from tests.support.broker import free_port
from tests.support.edge import build_settings, write_video
from tests.support.waiting import eventually

FRAMES = 24
BOUND = 10


def test_corrupt_outbox_is_reported_and_drops_are_counted_in_telemetry(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    # given an outbox file that is not a database, and a broker that is not there
    outbox = tmp_path / "outbox.db"
    garbage = b"this is not sqlite" * 200
    outbox.write_bytes(garbage)
    video = write_video(tmp_path / "gate.mp4", [f"GATE {i:02d}" for i in range(FRAMES)])
    settings = build_settings(
        {
            "device_id": "cam-01",
            "device_key": "k",
            "mqtt": {"host": "127.0.0.1", "port": free_port(), "reconnect_max_s": 2},
            "streams": [{"id": "gate", "url": str(video), "realtime": False}],
            "policy": {
                "escalate": "frames",  # a case per frame: the outbox is what is tested
                "sample_share": 1.0,
                "rate_per_min": 60_000,
                "burst": 1000,
                "dedup_window_s": 0,
            },
            "outbox": {"path": str(outbox), "max_messages": BOUND},
            "telemetry_interval_s": 0.2,
            "health": {"port": 0},
            "state_dir": str(tmp_path / "state"),
        }
    )
    agent = Agent(settings)
    accepted: list[int] = []  # frame indexes in the order their cases entered the outbox
    agent.add_escalation_callback(lambda case: accepted.append(case.frame_index))
    # when the agent starts and the video plays to its end with every frame escalated
    agent.start()
    try:
        eventually(lambda: agent.captures[0].finished and agent.pipeline.idle, 180, "video played")
        eventually(lambda: agent.outbox.dropped["telemetry"] > 0, 30, "a telemetry drop")
        # telemetry keeps being dropped while the agent runs: take the two views together
        views: list = []

        def agreeing_views() -> bool:
            views[:] = [agent.telemetry.collect(1.0), agent.report.health()]
            return views[0].outbox_dropped == sum(views[1]["outbox"]["dropped"].values())

        eventually(agreeing_views, 30, "telemetry and /healthz count the same drops")
        tel, health = views
    finally:
        agent.stop()

    # then the corrupt file was kept aside, reported, and the agent ran anyway
    moved = Path(health["outbox"]["recovered_from"])
    assert moved.read_bytes() == garbage and moved != outbox
    assert "outbox was corrupt" in caplog.text and str(moved) in caplog.text
    assert b"ef_edge_outbox_corrupt_total" in generate_latest()
    assert agent.cases.created == FRAMES

    # and the full outbox kept escalations (newest) over telemetry, counting every drop
    assert tel.outbox_depth == BOUND and tel.escalations.pending == BOUND
    assert tel.escalations.dropped == FRAMES - BOUND
    assert tel.outbox_dropped > tel.escalations.dropped  # telemetry was dropped too
    assert tel.escalations.sent == 0
    kept = [
        EscalationCase.model_validate_json(item.message.json).frame_index
        for item in _stored(outbox)
    ]
    assert sorted(accepted) == list(range(FRAMES))
    assert kept == accepted[-BOUND:]  # the oldest escalations went first


def _stored(path: Path) -> list[OutboxItem]:
    box = Outbox(path)
    try:
        return box.read(0, limit=100)
    finally:
        box.close()
