"""`edgefleet demo` end to end: the real broker, cloud and agents as processes, one command."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.demo import demo_missing
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.mark.skipif(demo_missing() is not None, reason=str(demo_missing()))
def test_demo_runs_end_to_end_and_prints_the_final_report(tmp_path: Path) -> None:
    # given a clean work folder and an empty cache, when the demo runs for 20 s with two
    # devices (and does not keep the dashboard up afterwards)
    workdir, cache = tmp_path / "w", tmp_path / "cache"
    env = {**os.environ, "COLUMNS": "200", "TERM": "dumb", "XDG_CACHE_HOME": str(cache)}
    argv = [sys.executable, "-m", "edgefleet", "demo", "--duration", "20", "--devices", "2"]
    result = subprocess.run(
        [*argv, "--workdir", str(workdir), "--linger", "0"],
        capture_output=True,
        text=True,
        timeout=840,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    output = result.stdout + result.stderr
    # then it exits 0, shows each start-up step, the dashboard URL and the final report
    assert result.returncode == 0, output[-4000:]
    for step in ("scenes", "enrolling devices", "Mosquitto", "cloud orchestrator", "edge agents"):
        assert step in output.split("dashboard:")[0], output[:3000]
    assert re.search(r"dashboard: http://127\.0\.0\.1:\d+/#key=", output), output[-2000:]
    assert re.search(r"up in [\d.]+ s", output)
    assert "final report" in output
    summary = re.search(
        r"edge-only accuracy ([\d.]+) %, edge\+cloud ([\d.]+) %, ([\d.]+) % of frames "
        r"escalated, ([\d,]+) bytes uplinked per frame",
        output,
    )
    assert summary, output[-2000:]
    assert re.search(r"streaming every frame as JPEG would send [\d,]+ bytes per frame", output)
    assert re.search(r"cloud only \(its primary model on sampled frames\) [\d.]+ %", output)
    answered = re.search(
        r"(\d+) of (\d+) escalated cases answered \((\d+) busy, (\d+) unanswered\)", output
    )
    assert answered, output[-2000:]
    assert re.search(r"2 agents at [\d.]+ fps each on average, [\d,]+ ms of CPU per frame", output)
    # and every device processed frames, was scored against the truth and sent bytes
    report = json.loads((workdir / "report.json").read_text())
    assert [r["device_id"] for r in report] == ["demo-cam-01", "demo-cam-02"]
    for device in report:
        assert device["frames"] > 0 and device["fps"] > 0 and device["cpu_ms_per_frame"] > 0
        assert 0.0 <= device["edge_accuracy"] <= 1.0
        assert 0.0 <= device["combined_accuracy"] <= 1.0
        assert 0.0 <= device["cloud_only_accuracy"] <= 1.0
        assert device["bytes_uplinked"] > 0
        assert device["verdicts"] + device["unanswered"] == device["escalated"]
        assert device["jpeg_bytes_per_frame"] > 0
        # the agent's own record holds as many frames as the report counts
        rows = (workdir / "devices" / device["device_id"] / "results.jsonl").read_text()
        assert rows.count('"kind": "frame"') == device["frames"]
    assert sum(d["escalated"] for d in report) == int(answered.group(2))
    # the devices were enrolled through the fleet: bundles and broker auth files exist
    for device_id in ("demo-cam-01", "demo-cam-02"):
        assert (workdir / "bundles" / device_id / "edge.yaml").is_file()
    logs = sorted(p.name for p in (workdir / "logs").iterdir())
    assert logs == ["cloud.log", "demo-cam-01.log", "demo-cam-02.log", "mosquitto.log"]
    # the scenes were rendered into the cache, with their cloud-only scores beside them
    scenes = sorted((cache / "edgefleet" / "demo").glob("scene-*"))
    assert len(scenes) == 2
    assert all(list(scene.glob("cloud-only-*.json")) for scene in scenes)
    # and nothing is left running: the HTTP and broker ports are closed again
    http_port = int(re.search(r"dashboard: http://127\.0\.0\.1:(\d+)/", output).group(1))
    conf = (workdir / "broker-auth" / "mosquitto.conf").read_text()
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
    if demo_missing() is not None and "mosquitto" in str(demo_missing()):
        pytest.skip(str(demo_missing()))
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


@pytest.mark.skipif(demo_missing() is not None, reason=str(demo_missing()))
def test_demo_with_no_arguments_stops_on_ctrl_c_with_the_report_and_no_leftovers(
    tmp_path: Path,
) -> None:
    import psutil

    # given `edgefleet demo` with no arguments (its temporary work folder under tmp_path)
    env = {**os.environ, "COLUMNS": "200", "TERM": "dumb", "TMPDIR": str(tmp_path)}
    demo = subprocess.Popen(
        [sys.executable, "-m", "edgefleet", "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(demo.stdout), daemon=True)
    reader.start()
    try:
        # when the default three agents have processed frames and escalated a hard one
        workdir = _wait_for(lambda: _work_dir(lines), 600, demo, lines)
        results = [workdir / "devices" / f"demo-cam-0{i}" / "results.jsonl" for i in (1, 2, 3)]
        _wait_for(lambda: all(_has(r, "frame") for r in results), 300, demo, lines)
        _wait_for(lambda: any(_has(r, "escalated") for r in results), 300, demo, lines)
        children = psutil.Process(demo.pid).children(recursive=True)
        assert len(children) >= 5  # mosquitto, the cloud and three agents
        # and the user presses Ctrl-C, long before the default duration is over
        demo.send_signal(signal.SIGINT)
        # then after the report the dashboard is still there, until a second Ctrl-C
        _wait_for(lambda: "the dashboard stays up" in "".join(lines), 300, demo, lines)
        port = int(re.search(r"dashboard: http://127\.0\.0\.1:(\d+)/", "".join(lines)).group(1))
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        demo.send_signal(signal.SIGINT)
        assert demo.wait(120) == 0, "".join(lines)[-4000:]
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    reader.join(30)
    output = "".join(lines)
    # then it printed the live table, the final report and the summary line
    assert "escalations" in output and "corrections" in output, output[-3000:]
    assert "final report" in output
    summary = re.search(r"edge\+cloud [\d.]+ %, ([\d.]+) % of frames escalated", output)
    assert summary, output[-3000:]
    assert float(summary.group(1)) > 0  # the escalated cases were recorded and counted
    for device_id in ("demo-cam-01", "demo-cam-02", "demo-cam-03"):
        assert device_id in output.split("final report")[1]
    # and no process it started is left, nor its temporary work folder
    _gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, [p.cmdline() for p in alive]
    assert not workdir.exists()


def _work_dir(lines: list[str]) -> Path | None:
    found = re.search(r"work dir:\s+(\S+)", "".join(lines))
    return Path(found.group(1)) if found else None


def _has(results: Path, kind: str) -> bool:
    try:
        return f'"kind": "{kind}"' in results.read_text()
    except OSError:
        return False


def _wait_for(check, timeout_s: float, demo: subprocess.Popen, lines: list[str]):  # type: ignore[no-untyped-def]
    values: list = []

    def holds() -> bool:
        values[:] = [check()]
        if values[0]:
            return True
        assert demo.poll() is None, "".join(lines)[-4000:]
        return False

    eventually(
        holds,
        timeout_s,
        "the demo to reach its next step",
        detail=lambda: "".join(lines)[-4000:],
        interval_s=0.5,
    )
    return values[0]


@pytest.mark.skipif(demo_missing() is not None, reason=str(demo_missing()))
@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "kill"])
def test_ctrl_c_during_start_up_stops_at_once_and_leaves_nothing_running(
    tmp_path: Path, stop_signal: signal.Signals
) -> None:
    import psutil

    # given a demo whose cloud is still starting (its log exists, it is not ready yet)
    demo = subprocess.Popen(
        [sys.executable, "-m", "edgefleet", "demo", "--devices", "1", "--workdir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "COLUMNS": "200", "TERM": "dumb"},
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(demo.stdout), daemon=True)
    reader.start()
    try:
        _wait_for(lambda: (tmp_path / "logs" / "cloud.log").exists(), 300, demo, lines)
        children = psutil.Process(demo.pid).children(recursive=True)
        assert children  # the broker and the cloud
        # when the user presses Ctrl-C (or `kill`s it)
        demo.send_signal(stop_signal)
        code = demo.wait(120)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    reader.join(30)
    output = "".join(lines)
    # then it stops without waiting for the start-up to finish, says so, and leaves nothing
    assert code == 130, output[-3000:]
    assert "stopped during start-up" in output
    assert "dashboard:" not in output
    _gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, [p.cmdline() for p in alive]


@pytest.mark.skipif(demo_missing() is not None, reason=str(demo_missing()))
def test_demo_runs_on_the_users_own_video(tmp_path: Path) -> None:
    import cv2
    import numpy as np

    # given the user's own clip (printed text on a grey wall), with no ground truth beside it
    clip = tmp_path / "dock-camera.mp4"
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"mp4v"), 10, (640, 360))
    for i in range(100):
        frame = np.full((360, 640, 3), 150, np.uint8)
        cv2.putText(frame, "GATE 7", (40 + i, 200), cv2.FONT_HERSHEY_SIMPLEX, 2.5, (0, 0, 0), 6)
        writer.write(frame)
    writer.release()
    # when the demo runs on it with one device
    workdir = tmp_path / "w"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgefleet",
            "demo",
            "--video",
            str(clip),
            "--devices",
            "1",
            "--duration",
            "8",
            "--linger",
            "0",
            "--workdir",
            str(workdir),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200", "TERM": "dumb"},
        stdin=subprocess.DEVNULL,
    )
    output = result.stdout + result.stderr
    # then the agent played that very file, and the report counts without scoring
    assert result.returncode == 0, output[-4000:]
    assert "final report" in output
    assert "edge-only accuracy –, edge+cloud –" in output
    [device] = json.loads((workdir / "report.json").read_text())
    assert device["frames"] > 0 and device["bytes_uplinked"] > 0
    assert device["edge_accuracy"] is None and device["combined_accuracy"] is None
    assert not (workdir / "videos").exists()  # nothing was rendered
    frames = [
        json.loads(line) for line in (workdir / "devices" / "demo-cam-01" / "results.jsonl").open()
    ]
    assert any("GATE" in " ".join(r.get("texts", [])).upper() for r in frames)
