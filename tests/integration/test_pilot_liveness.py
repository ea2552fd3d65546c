"""A dead camera shows offline: real broker, real `cloud serve`, real agents, `kill -9`.

The cloud's staleness window is short here (3 s), so the agents run well past it before
they die: their last will, signed when they connected, is older than the window.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import MosquittoBroker
from tests.support.edge import persistent_broker
from tests.support.pilot import Cloud, EdgeAgent, enroll, wait_online
from tests.support.waiting import eventually

SKEW_S = 3.0
INTERVAL_S = 2.0


@pytest.fixture
def pilot_broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    broker = persistent_broker(tmp_path / "mosquitto").start()
    yield broker
    broker.kill()


def _ran_past_the_skew(cloud: Cloud, device_id: str) -> bool:
    telemetry = cloud.device(device_id).get("telemetry") or {}
    return float(telemetry.get("uptime_s", 0)) > 2 * SKEW_S


def _offline(cloud: Cloud, device_id: str) -> bool:
    return cloud.devices()[device_id]["online"] is False


@pytest.mark.slow
def test_a_killed_agent_shows_offline_within_twice_its_reporting_interval(
    pilot_broker: MosquittoBroker, tmp_path: Path
) -> None:
    # given a cloud with a 3 s skew that expects telemetry every 2 s, and an agent sending it
    cloud = Cloud(
        tmp_path,
        pilot_broker,
        {"ingest": {"max_skew_s": SKEW_S}, "liveness": {"report_interval_s": INTERVAL_S}},
    )
    cam = enroll(cloud.data_dir, "cam-dead")["cam-dead"]
    agent = EdgeAgent(
        tmp_path,
        pilot_broker,
        cam,
        {"telemetry_interval_s": INTERVAL_S, "uplink": {"restamp_after_s": 1}},
    )
    cloud.start()
    agent.start()
    try:
        wait_online(cloud, "cam-dead")
        eventually(lambda: _ran_past_the_skew(cloud, "cam-dead"), 60, "an agent past the skew")
        assert cloud.devices()["cam-dead"]["fps"] is not None
        # when it is killed -9 (its broker connection outlives it by the keepalive)
        agent.kill_9()
        killed = time.monotonic()
        # then the cloud shows it offline within twice its reporting interval
        eventually(lambda: _offline(cloud, "cam-dead"), 30, "offline", detail=cloud.tail)
        assert time.monotonic() - killed <= 2 * INTERVAL_S
        # with how long, and without the fps it no longer has
        shown = cloud.devices()["cam-dead"]
        assert shown["offline_for_s"] is not None and shown["offline_for_s"] >= 0
        assert shown["fps"] is None
    finally:
        agent.close()
        cloud.kill()


@pytest.mark.slow
def test_the_last_will_of_an_agent_older_than_the_skew_is_taken_for_what_it_is(
    pilot_broker: MosquittoBroker, tmp_path: Path
) -> None:
    # given a cloud that would wait long before calling a silent device offline, and an
    # agent whose broker keepalive is short (the broker sends its will 1.5 keepalives on)
    cloud = Cloud(
        tmp_path,
        pilot_broker,
        {
            "ingest": {"max_skew_s": SKEW_S},
            "liveness": {"report_interval_s": INTERVAL_S, "offline_after_intervals": 100},
        },
    )
    cam = enroll(cloud.data_dir, "cam-will")["cam-will"]
    agent = EdgeAgent(
        tmp_path,
        pilot_broker,
        cam,
        {
            "telemetry_interval_s": INTERVAL_S,
            "uplink": {"restamp_after_s": 1},
            "mqtt": {"keepalive_s": 5},
        },
    )
    cloud.start()
    agent.start()
    try:
        wait_online(cloud, "cam-will")
        eventually(lambda: _ran_past_the_skew(cloud, "cam-will"), 60, "an agent past the skew")
        # when it is killed -9
        agent.kill_9()
        # then its will (signed more than the skew ago) marks it offline, long before the
        # cloud's own 200 s of silence would
        eventually(lambda: _offline(cloud, "cam-will"), 30, "offline", detail=cloud.tail)
        assert "rejected message on ef/v1/cam-will/status" not in cloud.tail(100_000)
    finally:
        agent.close()
        cloud.kill()
