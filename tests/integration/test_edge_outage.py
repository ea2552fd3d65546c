"""Broker outage: stopped for 10 s mid-run and restarted → every accepted case arrives."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.edge.agent import Agent
from tests.support.broker import MosquittoBroker
from tests.support.edge import (
    Collector,
    build_settings,
    edge_settings,
    persistent_broker,
    write_video,
)
from tests.support.waiting import eventually


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    """This test's own broker, with working persistence (sessions survive its restart)."""
    broker = persistent_broker(tmp_path / "mosquitto").start()
    yield broker
    broker.kill()


def test_broker_outage_loses_nothing_accepted_into_the_outbox(
    own_broker: MosquittoBroker, tmp_path: Path
) -> None:
    # given an agent that escalates every frame of a looping video in real time
    video = write_video(tmp_path / "loop.mp4", [f"LOT {i:02d}" for i in range(20)], fps=10)
    collector = Collector(own_broker, "cloud-outage")
    data = edge_settings(
        tmp_path,
        own_broker,
        "unused",
        streams=[{"id": "lot", "url": str(video), "loop": True, "realtime": True}],
        uplink={"replay_rate_per_s": 50},
    )
    agent = Agent(build_settings(data))
    accepted: list[str] = []
    agent.add_escalation_callback(lambda case: accepted.append(case.case_id))
    agent.start()
    try:
        eventually(lambda: len(collector.cases) >= 5, 60, "first escalations")
        # when the broker is down while 20 more cases are accepted
        own_broker.stop()
        eventually(lambda: not agent.uplink.connected.is_set(), 20, "agent to notice")
        during_before = len(accepted)
        # the pipeline keeps going into the outbox while the broker is away
        eventually(lambda: len(accepted) >= during_before + 20, 60, "cases accepted while down")
        assert not agent.uplink.connected.is_set()
        assert agent.outbox.depth("escalation") >= 20
        own_broker.start()
        # then after the restart the backlog drains while live cases keep flowing
        eventually(agent.uplink.connected.is_set, 60, "reconnection")
        eventually(lambda: len(accepted) > during_before + 40, 60, "live cases after restart")
        agent.stop_capture()
        eventually(lambda: agent.outbox.depth() == 0, 120, "outbox drained")
        eventually(lambda: set(accepted) <= set(collector.cases), 60, "every case delivered")
    finally:
        agent.stop()
    # every case accepted into the outbox arrived, and none twice after de-dup by case_id
    with collector.lock:
        delivered = set(collector.deliveries)
    assert delivered == set(accepted)
    assert len(collector.cases) == len(accepted)
    assert collector.rejected == []
    collector.close()
