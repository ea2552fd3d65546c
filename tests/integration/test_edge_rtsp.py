"""A real RTSP camera (gst-rtsp-server, H.264 over RTP/TCP) that freezes, comes back, loses
power and comes back: the agent reads it live, marks it stalled while the camera's socket
stays open but silent (the hang that no connection error announces), reconnects, and says
so in telemetry; for each decoder that reads RTSP on a CPU host."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support.broker import MosquittoBroker, free_port
from tests.support.edge import Collector, live_stream_agent
from tests.support.waiting import eventually

SERVER = Path(__file__).resolve().parents[1] / "support" / "rtsp_server.py"
SYSTEM_PYTHON = "/usr/bin/python3"


def _has_rtsp_server() -> bool:
    probe = "import gi; gi.require_version('GstRtspServer', '1.0')"
    if not os.path.exists(SYSTEM_PYTHON):
        return False
    return subprocess.run([SYSTEM_PYTHON, "-I", "-c", probe], capture_output=True).returncode == 0


def _serve(port: int) -> subprocess.Popen[str]:
    """The camera, once its port is bound."""
    # -I: the script's folder is not put first on sys.path (its types.py would shadow the stdlib's)
    server = subprocess.Popen(
        [SYSTEM_PYTHON, "-I", str(SERVER), str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    return server


@pytest.mark.skipif(
    not _has_rtsp_server(),
    reason="needs Debian's gir1.2-gst-rtsp-server-1.0, python3-gst-1.0 (make test installs both)",
)
@pytest.mark.parametrize("decoder", ["ffmpeg", "opencv"])
def test_rtsp_camera_frozen_then_killed_is_reconnected_each_time(
    broker: MosquittoBroker, tmp_path: Path, decoder: str
) -> None:
    port = free_port()
    server = _serve(port)
    collector = Collector(broker, f"cloud-rtsp-{decoder}")
    stream = {"id": "rtsp-cam", "url": f"rtsp://127.0.0.1:{port}/live", "decoder": decoder}
    agent = live_stream_agent(tmp_path, broker, stream)
    agent.start()
    latest = collector.last_stream

    def live(reconnects: int) -> bool:
        t = latest()
        return t is not None and t.state == "live" and t.fps > 0 and t.reconnects >= reconnects

    def out() -> bool:
        t = latest()
        return t is not None and t.state != "live"

    try:
        # given a live RTSP camera with frames reaching the model
        eventually(lambda: live(0), 60, "live stream")
        assert agent.pipeline.processed > 0
        # when the camera freezes (its TCP connection open, nothing sent), the stream is
        # marked stalled: no connection error says so, only the silence
        server.send_signal(signal.SIGSTOP)
        eventually(out, 60, "the frozen camera seen")
        frozen = latest()
        assert frozen is not None and frozen.state in {"stalled", "down", "connecting"}
        # and when it thaws, the agent is back on it
        server.send_signal(signal.SIGCONT)
        eventually(lambda: live(1), 90, "reconnected after the freeze")
        after_freeze = latest()
        assert after_freeze is not None
        # when the camera loses power, the outage is seen, and when it is back, so is the agent
        server.kill()
        server.wait()
        eventually(out, 60, "the dead camera seen")
        server = _serve(port)
        eventually(lambda: live(after_freeze.reconnects + 1), 90, "reconnected after the restart")
        health = agent.report.health()["streams"][0]
        assert health["state"] == "live" and health["reconnects"] >= 2
    finally:
        agent.stop()
        server.kill()
        server.wait()
        collector.close()
