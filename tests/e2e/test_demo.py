"""`edgefleet demo` end to end: the real broker, cloud and agents as processes, one command."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _missing() -> str | None:
    if not (shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists()):
        return "mosquitto is not installed (apt-get install mosquitto)"
    for module in ("edge.cli", "cloud.cli", "fleet.cli"):
        if importlib.util.find_spec(module) is None:
            return f"{module} does not exist yet: the demo needs its command"
    return None


@pytest.mark.skipif(_missing() is not None, reason=str(_missing()))
def test_demo_runs_end_to_end_and_prints_the_final_report(tmp_path: Path) -> None:
    # given a clean work folder, when the demo runs for 20 s with two devices
    env = {**os.environ, "COLUMNS": "200", "TERM": "dumb"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgefleet",
            "demo",
            "--duration",
            "20",
            "--devices",
            "2",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=840,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    output = result.stdout + result.stderr
    # then it exits 0 and prints the dashboard URL and the final report
    assert result.returncode == 0, output[-4000:]
    assert re.search(r"dashboard: http://127\.0\.0\.1:\d+/#key=", output), output[-2000:]
    assert "final report" in output
    summary = re.search(
        r"edge-only accuracy ([\d.]+) %, edge\+cloud ([\d.]+) %, ([\d.]+) % of frames "
        r"escalated, ([\d,]+) bytes uplinked per frame",
        output,
    )
    assert summary, output[-2000:]
    assert re.search(r"streaming every frame as JPEG would send [\d,]+ bytes per frame", output)
    # and every device processed frames, was scored against the truth and sent bytes
    report = json.loads((tmp_path / "report.json").read_text())
    assert [r["device_id"] for r in report] == ["demo-cam-01", "demo-cam-02"]
    for device in report:
        assert device["frames"] > 0
        assert 0.0 <= device["edge_accuracy"] <= 1.0
        assert 0.0 <= device["combined_accuracy"] <= 1.0
        assert device["bytes_uplinked"] > 0
        assert device["verdicts"] <= device["escalated"]
        assert device["jpeg_bytes_per_frame"] > 0
    # the devices were enrolled through the fleet: bundles and broker auth files exist
    for device_id in ("demo-cam-01", "demo-cam-02"):
        assert (tmp_path / "bundles" / device_id / "edge.yaml").is_file()
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert logs == ["cloud.log", "demo-cam-01.log", "demo-cam-02.log", "mosquitto.log"]
    # and nothing is left running: the HTTP and broker ports are closed again
    http_port = int(re.search(r"dashboard: http://127\.0\.0\.1:(\d+)/", output).group(1))
    conf = (tmp_path / "broker" / "mosquitto.conf").read_text()
    broker_port = int(re.search(r"^listener (\d+)", conf, re.M).group(1))
    for port in (http_port, broker_port):
        with socket.socket() as s, pytest.raises(OSError):
            s.settimeout(1.0)
            s.connect(("127.0.0.1", port))


def test_demo_help_has_an_example() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "edgefleet", "demo", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 0
    assert "edgefleet demo --duration 30 --devices 2" in result.stdout
    for option in ("--duration", "--devices", "--video", "--port"):
        assert option in result.stdout


def test_demo_rejects_a_missing_video(tmp_path: Path) -> None:
    if _missing() is not None and "mosquitto" in str(_missing()):
        pytest.skip(str(_missing()))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgefleet",
            "demo",
            "--video",
            str(tmp_path / "nope.mp4"),
            "--workdir",
            str(tmp_path / "w"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 1
    assert "nope.mp4: no such file" in result.stdout + result.stderr
