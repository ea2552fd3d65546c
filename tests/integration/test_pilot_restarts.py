"""No gap across a restart: the only cloud replica stopped for 15 s, then the broker
restarted; what the agent sent meanwhile is stored and answered within seconds of the
cloud being back, not after the agent's 300 s resend of unanswered cases."""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.broker import MosquittoBroker
from tests.support.edge import persistent_broker
from tests.support.pilot import Cloud, EdgeAgent, enroll, wait_online
from tests.support.waiting import eventually

INTERVAL_S = 2.0
DOWN_S = 15.0
BACK_WITHIN_S = 20.0  # "within seconds": far below the agent's 300 s resend


@pytest.fixture
def pilot_broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    broker = persistent_broker(tmp_path / "mosquitto").start()
    yield broker
    broker.kill()


def _awaiting(agent: EdgeAgent, created_after: float = 0.0) -> set[str]:
    """Cases the broker acknowledged to the agent that have no verdict on the device yet."""
    db = sqlite3.connect(f"file:{agent.folder / 'outbox.db'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT case_id FROM awaiting WHERE created > ?", (created_after,))
        return {r[0] for r in rows.fetchall()}
    finally:
        db.close()


def _stored_telemetry(cloud: Cloud) -> float:
    text = httpx.get(f"{cloud.url}/metrics", timeout=10).text
    found = re.search(
        r'^ef_cloud_ingest_total\{channel="telemetry",outcome="stored"\} (\S+)$', text, re.M
    )
    return float(found.group(1)) if found else 0.0


def _broker_connected(cloud: Cloud) -> bool:
    body = httpx.get(f"{cloud.url}/readyz", timeout=10).json()
    return bool(body["broker"]["connected"])


def _agent(tmp_path: Path, broker: MosquittoBroker, cloud: Cloud, device_id: str) -> EdgeAgent:
    cam = enroll(cloud.data_dir, device_id)[device_id]
    return EdgeAgent(
        tmp_path,
        broker,
        cam,
        {
            "telemetry_interval_s": INTERVAL_S,
            "policy": {"rate_per_min": 120, "burst": 5},  # a case every half second
        },
    )


@pytest.mark.slow
def test_cases_and_telemetry_sent_while_the_only_cloud_is_stopped_are_answered_on_its_return(
    pilot_broker: MosquittoBroker, tmp_path: Path
) -> None:
    # given one cloud replica and an agent sending cases and telemetry (every 2 s)
    cloud = Cloud(tmp_path, pilot_broker, {"liveness": {"report_interval_s": INTERVAL_S}})
    agent = _agent(tmp_path, pilot_broker, cloud, "cam-gap")
    cloud.start()
    agent.start()
    try:
        wait_online(cloud, "cam-gap")
        eventually(lambda: _stored_telemetry(cloud) >= 2, 60, "telemetry stored")
        # when the cloud is stopped gracefully (SIGTERM) for 15 s while the agent sends
        assert cloud.stop() in (0, -15), cloud.tail()  # uvicorn re-raises SIGTERM when done
        stopped_at, stopped = time.time(), time.monotonic()
        eventually(
            lambda: time.monotonic() - stopped >= DOWN_S and len(_awaiting(agent, stopped_at)) >= 5,
            DOWN_S + 30,
            "cases sent while the cloud is down",
            detail=agent.tail,
        )
        waiting = _awaiting(agent, stopped_at)
        # and started again
        cloud.start()
        back = time.monotonic()
        # then the telemetry sent meanwhile (one every 2 s) is stored as soon as it is back
        sent_while_down = int(DOWN_S / INTERVAL_S) - 1
        eventually(
            lambda: _stored_telemetry(cloud) >= sent_while_down,
            3.0,
            "the telemetry sent while the cloud was down",
        )
        # and every case sent meanwhile is answered on the device within seconds
        eventually(
            lambda: not waiting & _awaiting(agent),
            BACK_WITHIN_S,
            "the cases sent while the cloud was down answered",
            detail=cloud.tail,
        )
        assert time.monotonic() - back < BACK_WITHIN_S
        # and the verdicts in flight at the stop were published before the process exited
        assert "was not published" not in cloud.tail(1_000_000)
        assert "not currently connected" not in cloud.tail(1_000_000)
        # and the device took every republished verdict as fresh
        assert "rejected a message" not in agent.tail(1_000_000)
    finally:
        agent.close()
        cloud.kill()


@pytest.mark.slow
def test_cases_sent_while_the_broker_restarts_are_answered_once_the_cloud_is_back(
    pilot_broker: MosquittoBroker, tmp_path: Path
) -> None:
    # given a cloud that reconnects only 6 s after the broker is back (the agent: 1-2 s)
    cloud = Cloud(
        tmp_path,
        pilot_broker,
        {
            "liveness": {"report_interval_s": INTERVAL_S},
            "mqtt": {"reconnect_min_s": 6, "reconnect_max_s": 6},
        },
    )
    agent = _agent(tmp_path, pilot_broker, cloud, "cam-brk")
    cloud.start()
    agent.start()
    try:
        wait_online(cloud, "cam-brk")
        eventually(lambda: _stored_telemetry(cloud) >= 2, 60, "telemetry stored")
        stored_before = _stored_telemetry(cloud)
        # when the broker restarts (a graceful stop saves its persistence)
        pilot_broker.stop()
        restarted_at = time.time()
        pilot_broker.start()
        # and the agent sends cases and telemetry before the cloud is connected again
        sent_before_cloud: set[str] = set()

        def reconnected() -> bool:
            if _broker_connected(cloud):
                return True
            sent_before_cloud.update(_awaiting(agent, restarted_at))  # sampled while waiting
            return False

        eventually(
            reconnected,
            60 - (time.time() - restarted_at),  # 60 s from the restart
            "the cloud reconnected to the broker",
            detail=cloud.tail,
            interval_s=0.1,
        )
        assert sent_before_cloud, "no case was sent while the cloud was away"
        # then each is answered within seconds of the cloud's return
        eventually(
            lambda: not sent_before_cloud & _awaiting(agent),
            BACK_WITHIN_S,
            "the cases sent while the cloud was away answered",
            detail=cloud.tail,
        )
        # and no telemetry of the outage is missing: one every 2 s since the restart
        elapsed = time.time() - restarted_at
        eventually(
            lambda: _stored_telemetry(cloud) - stored_before >= int(elapsed / INTERVAL_S) - 1,
            BACK_WITHIN_S,
            "the telemetry sent while the cloud was away",
        )
    finally:
        agent.close()
        cloud.kill()
