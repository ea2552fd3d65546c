"""One device id, one agent: a second `edge run` for a device already running is refused
with a message saying so, and the first keeps running (real broker, cloud and agents)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import MosquittoBroker
from tests.support.edge import persistent_broker
from tests.support.pilot import REPO, Cloud, EdgeAgent, enroll, wait_online
from tests.support.waiting import eventually

TAKEOVER_S = 3.0


@pytest.fixture
def pilot_broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    broker = persistent_broker(tmp_path / "mosquitto").start()
    yield broker
    broker.kill()


def _uptime(cloud: Cloud, device_id: str) -> float:
    telemetry = cloud.device(device_id).get("telemetry") or {}
    return float(telemetry.get("uptime_s", 0))


def _keeps_reporting(cloud: Cloud, first: EdgeAgent, device_id: str) -> None:
    """The first agent is alive, online and its telemetry still advances."""
    assert first.process is not None and first.process.poll() is None, first.tail()
    since = _uptime(cloud, device_id)
    eventually(lambda: _uptime(cloud, device_id) > since + 2, 30, "the first agent's telemetry")
    assert cloud.devices()[device_id]["online"] is True


@pytest.mark.slow
def test_a_second_agent_on_the_same_bundle_is_refused_and_the_first_keeps_running(
    pilot_broker: MosquittoBroker, tmp_path: Path
) -> None:
    # given an agent running from its bundle's edge.yaml
    cloud = Cloud(tmp_path, pilot_broker)
    cam = enroll(cloud.data_dir, "cam-twice")["cam-twice"]
    first = EdgeAgent(tmp_path, pilot_broker, cam, {"telemetry_interval_s": 1})
    cloud.start()
    first.start()
    try:
        wait_online(cloud, "cam-twice")
        # when a second agent is started on the same file
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "edgefleet",
                "edge",
                "run",
                "-c",
                str(first.folder / "edge.yaml"),
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        # then it exits non-zero, saying the device id is taken and by which process
        assert second.returncode != 0
        assert "device id cam-twice is already connected" in second.stderr, second.stderr
        assert f"pid {first.process.pid if first.process else '?'}" in second.stderr
        # and the first keeps running, never taken over
        _keeps_reporting(cloud, first, "cam-twice")
        assert "disconnected from broker" not in first.tail(1_000_000)
    finally:
        first.close()
        cloud.kill()


@pytest.mark.slow
def test_a_second_agent_elsewhere_stops_and_the_first_keeps_its_broker_session(
    pilot_broker: MosquittoBroker, tmp_path: Path
) -> None:
    # given an agent that has held its broker connection for longer than `takeover_s`
    options = {"telemetry_interval_s": 1, "uplink": {"takeover_s": TAKEOVER_S}}
    cloud = Cloud(tmp_path, pilot_broker)
    cam = enroll(cloud.data_dir, "cam-dup")["cam-dup"]
    first = EdgeAgent(tmp_path, pilot_broker, cam, options, name="host-a")
    cloud.start()
    first.start()
    second = EdgeAgent(tmp_path, pilot_broker, cam, options, name="host-b")
    try:
        wait_online(cloud, "cam-dup")
        eventually(lambda: _uptime(cloud, "cam-dup") > 2 * TAKEOVER_S, 60, "a long connection")
        # when the same device's bundle is started on another host (its own data dir)
        second.start()
        assert second.process is not None
        code = second.process.wait(120)
        # then the newcomer exits non-zero, saying the device id is already connected
        assert code != 0, second.tail()
        assert "device id cam-dup is already connected" in second.tail(1_000_000)
        # and the first, which took its session back each time, keeps running: no loop
        _keeps_reporting(cloud, first, "cam-dup")
        assert "already connected" not in first.tail(1_000_000)
    finally:
        second.close()
        first.close()
        cloud.kill()
