"""`kill -9` of the agent mid-run, then a restart: every case accepted into the outbox
arrives (none twice after de-dup by case_id), the broker publishes the last will, and
no telemetry seq is given to two messages across the restarts."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.broker import MosquittoBroker
from tests.support.edge import Collector, edge_settings, persistent_broker, write_video
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]


def _start_agent(config: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "edgefleet", "edge", "run", "-c", str(config)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )


def _pending_cases(outbox: Path) -> set[str]:
    db = sqlite3.connect(f"file:{outbox}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT body FROM messages WHERE kind = 'escalation'").fetchall()
    finally:
        db.close()
    return {json.loads(bytes(r[0]))["case_id"] for r in rows}


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    """This test's own broker, with working persistence (sessions survive its restart)."""
    broker = persistent_broker(tmp_path / "mosquitto").start()
    yield broker
    broker.kill()


def test_kill_9_and_restart_loses_nothing(own_broker: MosquittoBroker, tmp_path: Path) -> None:
    # given an agent process escalating every frame of a looping video
    video = write_video(tmp_path / "yard.mp4", [f"YARD {i:02d}" for i in range(20)], fps=10)
    data = edge_settings(
        tmp_path,
        own_broker,
        "unused",
        streams=[{"id": "yard", "url": str(video), "loop": True, "realtime": True}],
        telemetry_interval_s=0.5,
    )
    config = tmp_path / "edge.yaml"
    config.write_text(yaml.safe_dump(data))
    outbox = tmp_path / "outbox.db"
    log = tmp_path / "agent.log"
    collector = Collector(own_broker, "cloud-crash")
    agent = _start_agent(config, log)
    try:
        eventually(lambda: len(collector.cases) >= 8, 120, "cases from the first run")
        eventually(lambda: len(collector.telemetry) >= 2, 60, "telemetry from the first run")
        # when it is killed with SIGKILL mid-run (broker up)
        _kill_9(agent)
        accepted = set(collector.cases) | _pending_cases(outbox)
        # then the broker announces it offline through the last will
        eventually(
            lambda: any(s.state == "offline" for s, _ in collector.statuses), 60, "last will"
        )
        # when it restarts, and is killed again while the broker is down and cases wait
        agent = _start_agent(config, log)
        eventually(lambda: accepted <= set(collector.cases), 120, "cases of the first run")
        own_broker.stop()
        eventually(lambda: len(_pending_cases(outbox)) >= 5, 60, "cases waiting in the outbox")
        _kill_9(agent)
        pending = _pending_cases(outbox)
        accepted |= set(collector.cases) | pending
        with collector.lock:
            seqs_before = [t.seq for t in collector.telemetry]
        # and then the broker and the agent come back
        own_broker.start()
        agent = _start_agent(config, log)
        eventually(lambda: accepted <= set(collector.cases), 120, "every accepted case")
        eventually(
            lambda: any(t.seq > max(seqs_before) for t in collector.telemetry), 60, "telemetry"
        )
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    # then everything accepted before each kill arrived (once after de-dup by case_id)
    assert pending and pending <= set(collector.cases)
    assert accepted <= set(collector.cases)
    assert collector.rejected == []
    # and no seq was given to two telemetry messages: a seq seen twice is the same message
    # delivered again (at least once: a kill between the PUBACK and the outbox's delete)
    by_seq: dict[int, set[str]] = {}
    for t in collector.telemetry:
        by_seq.setdefault(t.seq, set()).add(t.model_dump_json())
    assert all(len(bodies) == 1 for bodies in by_seq.values()), "a telemetry seq was reused"
    eventually(lambda: collector.statuses[-1][0].state == "offline", 20, "graceful offline")
    assert "Traceback" not in log.read_text()
    collector.close()


def _kill_9(agent: subprocess.Popen[bytes]) -> None:
    agent.send_signal(signal.SIGKILL)
    agent.wait(30)
