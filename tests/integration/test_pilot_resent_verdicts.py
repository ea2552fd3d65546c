"""A resent case's stored verdict is accepted by the device: real broker, `cloud serve`
and `edge run`.

The agent's staleness window is short here (3 s). Its cases are answered while it is
down, and the broker queues those verdicts until they are older than the window: the
device refuses them on its return, so only the cloud's answers to the agent's resends
can close the cases. The cloud stamps each with the time it sends it, not the case's.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest

from tests.support.broker import MosquittoBroker
from tests.support.edge import persistent_broker
from tests.support.pilot import OP_KEY, Cloud, EdgeAgent, enroll, wait_online
from tests.support.waiting import eventually

SKEW_S = 3.0
RESEND_S = 6.0


@pytest.fixture
def pilot_broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    broker = persistent_broker(tmp_path / "mosquitto").start()
    yield broker
    broker.kill()


def _awaiting(agent: EdgeAgent) -> set[str]:
    """Cases the broker acknowledged to the agent that have no verdict on the device yet."""
    db = sqlite3.connect(f"file:{agent.folder / 'outbox.db'}?mode=ro", uri=True)
    try:
        return {r[0] for r in db.execute("SELECT case_id FROM awaiting").fetchall()}
    finally:
        db.close()


def _verdict_times(cloud: Cloud, case_ids: set[str]) -> list[datetime] | None:
    """When the cloud answered each case (None until every one is answered)."""
    times = []
    for case_id in case_ids:
        response = httpx.get(
            f"{cloud.url}/v1/escalations/{case_id}",
            headers={"Authorization": f"Bearer {OP_KEY}"},
            timeout=10,
        )
        verdict = response.json().get("verdict") if response.status_code == 200 else None
        if not verdict:
            return None
        times.append(datetime.fromisoformat(verdict["ts"].replace("Z", "+00:00")))
    return times


def _older_than_the_skew(answered: list[datetime]) -> bool:
    return (datetime.now(timezone.utc) - max(answered)).total_seconds() > 2 * SKEW_S


@pytest.mark.slow
def test_a_stored_verdict_sent_again_after_the_skew_is_accepted_by_the_device(
    pilot_broker: MosquittoBroker, tmp_path: Path
) -> None:
    # given an agent that refuses verdicts more than 3 s off and resends unanswered cases
    # every 6 s, and a cloud that is stopped while the agent sends cases
    cloud = Cloud(tmp_path, pilot_broker)
    cam = enroll(cloud.data_dir, "cam-resend")["cam-resend"]
    agent = EdgeAgent(
        tmp_path,
        pilot_broker,
        cam,
        {
            "uplink": {
                "max_skew_s": SKEW_S,
                "resend_unanswered_s": RESEND_S,
                "max_unanswered_resends": 100,  # a case leaves only by its verdict
            },
            "policy": {"rate_per_min": 120, "burst": 5},
        },
    )
    cloud.start()
    agent.start()
    try:
        wait_online(cloud, "cam-resend")
        cloud.stop()
        eventually(lambda: len(_awaiting(agent)) >= 3, 60, "cases sent", detail=agent.tail)
        # when the agent dies, the cloud comes back and answers them (the broker queues
        # the verdicts for the agent's session) and the verdicts grow older than the skew
        agent.kill_9()
        waiting = _awaiting(agent)
        cloud.start()
        eventually(
            lambda: _verdict_times(cloud, waiting) is not None,
            60,
            "the cases answered while the agent is down",
            detail=cloud.tail,
        )
        answered = _verdict_times(cloud, waiting) or []
        eventually(lambda: _older_than_the_skew(answered), 30, "verdicts older than the skew")
        agent.start()
        # then the device refuses the queued verdicts as stale ...
        eventually(
            lambda: "rejected a message on ef/v1/cam-resend/results" in agent.tail(1_000_000),
            60,
            "the queued verdicts refused as stale",
            detail=agent.tail,
        )
        # ... and takes the stored verdicts the cloud sends again for its resent cases
        eventually(
            lambda: not waiting & _awaiting(agent),
            RESEND_S + 30,
            "the resent cases answered on the device",
            detail=lambda: agent.tail() + cloud.tail(),
        )
    finally:
        agent.close()
        cloud.kill()
