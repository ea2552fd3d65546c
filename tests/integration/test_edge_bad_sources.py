"""Bad sources next to a good one: each broken stream is `down` (with its reason) in
telemetry and /healthz, the good stream keeps flowing, credentials stay out of the logs,
and nothing crashes or loops."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from edgefleet.edge.agent import Agent
from edgefleet.edge.settings import SourceSettings
from edgefleet.edge.sources import VideoSource, make_source
from tests.support.broker import MosquittoBroker, free_port
from tests.support.edge import Collector, build_settings, edge_settings, write_video
from tests.support.waiting import eventually


class GarbageCamera(VideoSource):
    """A camera whose driver hands back junk: wrong types, shapes and dtypes."""

    kind = "garbage"

    def __init__(self) -> None:
        self._rng = np.random.default_rng(0)
        self._junk = [None, b"\x00\x01", np.zeros((4, 4), np.uint8), np.ones((48, 64, 3))]

    def open(self) -> None:
        pass

    def read(self) -> object:
        return self._junk[int(self._rng.integers(len(self._junk)))]

    def close(self) -> None:
        pass


def test_bad_sources_are_down_in_telemetry_while_a_good_one_flows(
    broker: MosquittoBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    good = write_video(tmp_path / "good.mp4", [f"OK {i}" for i in range(6)])
    notes = tmp_path / "notes.mp4"
    notes.write_text("not a video\n" * 50)
    streams = [
        {"id": "good", "url": str(good), "loop": True, "realtime": True},
        {"id": "cam-auth", "url": f"rtsp://admin:hunter2@127.0.0.1:{free_port()}/live"},
        {"id": "notes", "url": str(notes)},
        {"id": "junk", "url": "garbage", "max_invalid_frames": 5},
    ]
    for stream in streams[1:]:
        stream.update(reconnect_min_s=0.2, reconnect_max_s=1, open_timeout_s=2)

    def factory(settings: SourceSettings) -> VideoSource:
        return GarbageCamera() if settings.url == "garbage" else make_source(settings)

    collector = Collector(broker, "cloud-bad-sources")
    data = edge_settings(tmp_path, broker, "unused", streams=streams, telemetry_interval_s=0.5)
    agent = Agent(build_settings(data), source_factory=factory)
    agent.start()
    try:

        def states() -> dict[str, tuple[str, int, float]]:
            with collector.lock:
                if not collector.telemetry:
                    return {}
                last = collector.telemetry[-1]
            return {s.stream_id: (s.state, s.reconnects, s.fps) for s in last.streams}

        # then the good stream is live with frames while each bad one is reconnected, not live
        eventually(
            lambda: (
                (st := states())
                and st["good"][0] == "live"
                and st["good"][2] > 0
                and all(st[i][0] != "live" and st[i][1] >= 2 for i in ("cam-auth", "notes", "junk"))
            ),
            90,
            "good live, bad ones down and retried",
        )
        report = {s["stream_id"]: s for s in agent.report.health()["streams"]}
        assert "not a readable video" in report["notes"]["last_error"]
        assert "garbage frames" in report["junk"]["last_error"]
        assert report["cam-auth"]["last_error"] and report["junk"]["frames"] == 0
        assert all(c.alive for c in agent.captures)
        ok, reasons = agent.report.ready()
        assert not ok and "cam-auth" in reasons[0]
    finally:
        agent.stop()
        collector.close()
    # credentials in the RTSP url never reached a log line
    assert "hunter2" not in caplog.text
    assert "rtsp://***@127.0.0.1" in caplog.text
