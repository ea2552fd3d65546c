"""A live stream served by a local ffmpeg (MPEG-TS over UDP) dies and comes back:
the agent marks it stalled/down, reconnects with backoff, and says so in telemetry."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.support.broker import MosquittoBroker
from tests.support.edge import Collector, live_stream_agent
from tests.support.waiting import eventually


def _udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            "ffmpeg",
            "-loglevel",
            "error",
            "-re",
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=160x120:rate=10",
            "-f",
            "mpegts",
            f"udp://127.0.0.1:{port}?pkt_size=1316",
        ],
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs ffmpeg")
def test_udp_stream_killed_and_restarted_is_reconnected(
    broker: MosquittoBroker, tmp_path: Path
) -> None:
    port = _udp_port()
    server = _serve(port)
    collector = Collector(broker, "cloud-stream-restart")
    agent = live_stream_agent(tmp_path, broker, {"id": "udp-cam", "url": f"udp://127.0.0.1:{port}"})
    agent.start()
    latest = collector.last_stream

    try:
        # given a live stream with frames flowing
        eventually(
            lambda: (t := latest()) is not None and t.state == "live" and t.fps > 0,
            60,
            "live stream",
        )
        # when ffmpeg dies, the stream is reported stalled or down
        server.kill()
        server.wait()
        eventually(lambda: (t := latest()) is not None and t.state != "live", 60, "outage seen")
        lost = latest()
        assert lost is not None and lost.state in {"stalled", "down", "connecting"}
        # when it comes back, the agent reconnects and says so
        server = _serve(port)
        eventually(
            lambda: (
                (t := latest()) is not None
                and t.state == "live"
                and t.reconnects >= 1
                and t.fps > 0
            ),
            90,
            "reconnected stream",
        )
        health = agent.report.health()["streams"][0]
        assert health["state"] == "live" and health["reconnects"] >= 1
    finally:
        agent.stop()
        server.kill()
        server.wait()
        collector.close()
