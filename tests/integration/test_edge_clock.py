"""The agent checks its clock against the cloud's (the HTTP Date header of the real cloud
app) at start and says plainly, in its log, health and readiness, that the device clock
is off and by how much when it is beyond the cloud's skew."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.edge.agent import Agent
from edgefleet.edge.clock import ClockWatch
from edgefleet.edge.settings import ClockSettings, EdgeSettings
from edgefleet.shared.messages import Detection, ModelInfo
from tests.support.broker import free_port
from tests.support.edge import KEY, write_video
from tests.support.fleet import FleetServer

HOUR = 3600.0


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetServer]:
    server = FleetServer(tmp_path_factory.mktemp("cloud")).start()
    yield server
    server.stop()


def behind(seconds: float):
    """A device clock that booted `seconds` behind the real time (no RTC battery)."""
    return lambda: time.time() - seconds


def test_a_clock_in_step_with_the_cloud_is_ok(cloud: FleetServer) -> None:
    reading = ClockWatch(cloud.url, ClockSettings()).check()
    assert reading.state == "ok", reading
    assert reading.offset_s is not None and reading.uncertainty_s is not None
    assert abs(reading.offset_s) <= reading.uncertainty_s + 0.5
    assert reading.reference == f"{cloud.url}/healthz"


def test_a_clock_an_hour_behind_is_reported_off_by_how_much(cloud: FleetServer, caplog) -> None:
    watch = ClockWatch(cloud.url, ClockSettings(), now=behind(HOUR))
    with caplog.at_level(logging.ERROR, "edgefleet.edge.clock"):
        reading = watch.check()
    assert reading.state == "off"
    assert reading.offset_s is not None and abs(reading.offset_s + HOUR) < 2
    assert re.search(r"device clock is off: 3(599|600|601) s behind the cloud", reading.detail)
    assert "more than 300 s off as stale" in reading.detail
    (record,) = caplog.records
    assert record.levelno == logging.ERROR and record.state == "off"  # type: ignore[attr-defined]


def test_within_the_skew_is_not_off_and_an_unreachable_cloud_is_unknown(cloud) -> None:
    assert ClockWatch(cloud.url, ClockSettings(), now=behind(120)).check().state == "ok"
    nowhere = f"http://127.0.0.1:{free_port()}"
    reading = ClockWatch(nowhere, ClockSettings(timeout_s=2)).check()
    assert reading.state == "unknown" and "cannot read the cloud's time" in reading.detail
    assert ClockWatch(None, ClockSettings()).check().state == "unknown"


class OneLine:
    """A hand-written Predictor: every frame reads as one line."""

    info = ModelInfo(name="one-line", version="1")

    def predict(self, image, *, fmt: str = "rgb") -> list[Detection]:
        return [Detection(text="LOT 1", score=0.9)]

    def close(self) -> None:
        pass


def test_the_agent_checks_at_start_and_its_health_and_readiness_say_so(
    cloud: FleetServer, tmp_path: Path
) -> None:
    # given an agent on a device whose clock booted an hour behind
    video = write_video(tmp_path / "gate.mp4", ["LOT 1"])
    settings = EdgeSettings(
        device_id="cam-01",
        device_key=KEY.hex(),
        api_url=cloud.url,
        mqtt={"host": "127.0.0.1", "port": free_port()},
        streams=[{"id": "gate", "url": str(video), "loop": True}],
        outbox={"path": str(tmp_path / "outbox.db")},
        health={"enabled": False},
        state_dir=str(tmp_path / "state"),
    )
    agent = Agent(settings, model=OneLine(), wall_clock=behind(HOUR))
    assert agent.report.health()["clock"]["state"] == "unknown"  # not checked before start
    # when it starts
    agent.start()
    try:
        # then the check has run, and health and readiness say the clock is off, by how much
        clock = agent.report.health()["clock"]
        assert clock["state"] == "off" and abs(clock["offset_s"] + HOUR) < 2
        ready, reasons = agent.report.ready()
        assert not ready
        assert any(r.startswith("the device clock is off: 3") for r in reasons), reasons
    finally:
        agent.stop()
