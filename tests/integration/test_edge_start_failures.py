"""An agent that cannot start ends cleanly: a taken health port or a missing model gives a
clear error and exit status 2, stops whatever had started, and never leaves a process
hanging with its capture threads running."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from edgefleet.edge.agent import Agent
from edgefleet.shared.errors import EdgefleetError
from tests.support.broker import free_port
from tests.support.edge import build_settings, write_video

REPO = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, **extra: object) -> dict:
    video = write_video(tmp_path / "clip.mp4", [f"LOT {i}" for i in range(4)])
    data: dict = {
        "device_id": "cam-01",
        "device_key": "k",
        "mqtt": {"host": "127.0.0.1", "port": free_port()},
        "streams": [{"id": "clip", "url": str(video), "loop": True}],
        "outbox": {"path": str(tmp_path / "outbox.db")},
        "health": {"port": 0},
        "state_dir": str(tmp_path / "state"),
    }
    data.update(extra)
    return data


def test_a_taken_health_port_exits_with_status_2_instead_of_hanging(tmp_path: Path) -> None:
    # given a port some other process already listens on
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        data = _config(tmp_path, health={"port": port})
        config = tmp_path / "edge.yaml"
        config.write_text(
            "\n".join(
                [
                    "device_id: cam-01",
                    "device_key: k",
                    f"mqtt: {{host: 127.0.0.1, port: {data['mqtt']['port']}}}",
                    f"streams: [{{id: clip, url: {data['streams'][0]['url']}, loop: true}}]",
                    f"outbox: {{path: {data['outbox']['path']}}}",
                    f"health: {{port: {port}}}",
                    f"state_dir: {data['state_dir']}",
                ]
            )
            + "\n"
        )
        # when the agent is started on it
        result = subprocess.run(
            [sys.executable, "-m", "edgefleet", "edge", "run", "-c", str(config)],
            capture_output=True,
            text=True,
            timeout=120,  # the bug this guards against: the process never exited
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    # then it says why and exits 2, with no traceback
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"error: health.port: cannot listen on 127.0.0.1:{port}: Address already in use" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr


def test_a_model_that_does_not_load_closes_what_had_been_built(tmp_path: Path) -> None:
    # given settings whose model is not in the registry, and the agent threads running now
    health_port = free_port()
    settings = build_settings(
        _config(tmp_path, model={"name": "no-such-model"}, health={"port": health_port})
    )
    threads_before = set(threading.enumerate())
    # when the agent is built, then the error is the model's
    with pytest.raises(EdgefleetError, match="no-such-model"):
        Agent(settings)
    # and the health port is free again, the outbox is closed (SQLite removes the WAL
    # file when its last connection closes) and no thread was left behind
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", health_port))
    assert (tmp_path / "outbox.db").exists() and not (tmp_path / "outbox.db-wal").exists()
    assert set(threading.enumerate()) <= threads_before
