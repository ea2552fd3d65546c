"""`edgefleet demo --chaos` end to end: the five faults against the real processes, and
the ledger that proves nothing was lost or done twice."""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.demo import demo_missing

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.mark.skipif(demo_missing() is not None, reason=str(demo_missing()))
def test_a_short_chaos_run_loses_nothing_and_shows_every_fault(tmp_path: Path) -> None:
    # given a clean work folder, when the demo runs 45 s with two devices under a seeded
    # schedule of all five faults
    workdir = tmp_path / "w"
    env = {**os.environ, "COLUMNS": "200", "TERM": "dumb"}
    argv = [sys.executable, "-m", "edgefleet", "demo", "--chaos", "--chaos-seed", "3"]
    result = subprocess.run(
        [*argv, "--duration", "45", "--devices", "2", "--workdir", str(workdir), "--linger", "0"],
        capture_output=True,
        text=True,
        timeout=840,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    # then the schedule was printed first, with every fault
    schedule = output.split("dashboard:")[0]
    assert "chaos schedule (seed 3" in schedule
    for kind in ("broker_kill", "broker_freeze", "cloud_kill", "agent_kill", "uplink_cut"):
        assert kind in schedule, schedule
    # and each fault hit a real process and healed, with how long it took
    record = json.loads((workdir / "ledger.json").read_text())
    incidents = record["incidents"]
    lines = [i["line"] for i in incidents]
    assert all(i["healthy_after_s"] is not None for i in incidents), lines
    whats = {(i["component"], i["what"].split(" (")[0]) for i in incidents}
    assert ("broker", "kill -9") in whats and ("cloud-b", "kill -9") in whats, lines
    assert any(c == "broker" and w.startswith("frozen") for c, w in whats), lines
    assert any(c.startswith("demo-cam-") and w == "kill -9" for c, w in whats), lines
    assert any(c.endswith(" uplink") and w.startswith("uplink cut") for c, w in whats), lines
    killed = [i for i in incidents if i["what"] == "kill -9"]
    assert all(i["restarts"] >= 1 for i in killed), lines
    # and the ledger, from the agents' records and the cloud's store, shows zero loss
    ledger = record["ledger"]
    assert ledger["created"] > 0
    assert ledger["lost"] == 0 and ledger["missing"] == [], ledger
    assert ledger["duplicates_processed"] == 0, ledger
    for stage in ("delivered", "stored", "answered", "received"):
        assert ledger[stage] == ledger["created"], ledger
    assert re.search(r"lost = 0, duplicates processed = 0, (\d+) of \1 cases answered", output)
    # every agent had stopped making cases (its pipeline drained) before the ledger was read
    for device_id in ("demo-cam-01", "demo-cam-02"):
        rows = (workdir / "devices" / device_id / "results.jsonl").read_text()
        assert '"kind": "drained"' in rows
    assert "ledger (devices' records" in output
    # the dashboard's event log got one line per healed fault
    conf = (workdir / "broker-auth" / "mosquitto.conf").read_text()
    broker_port = int(re.search(r"^listener (\d+)", conf, re.M).group(1))
    with sqlite3.connect(workdir / "cloud" / "cloud.db") as db:
        posted = [row[0] for row in db.execute("SELECT message FROM fleet_events")]
    assert sorted(posted) == sorted(lines)
    # and nothing is left running: the broker's port is closed again
    with socket.socket() as s, pytest.raises(OSError):
        s.settimeout(1.0)
        s.connect(("127.0.0.1", broker_port))
