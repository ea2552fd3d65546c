"""The uplink against a real Mosquitto: connect, disconnect while live, refused PUBACKs keep
the message, the replay after an outage is paced so live messages overtake the backlog,
and a message that waited too long is restamped when it finally goes. (The state machine
itself, with an injected clock: tests/unit/test_edge_delivery.py.)"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from edgefleet.bench.harness import escalation_case
from edgefleet.edge.delivery import NACKED
from edgefleet.edge.outbox import Outbox
from edgefleet.edge.settings import UplinkSettings
from edgefleet.edge.uplink import Uplink
from edgefleet.shared.messages import DeviceTelemetry, EscalationCounters, utcnow
from edgefleet.shared.mqtt import MqttSettings
from edgefleet.shared.wire import Serialised, serialise, serialise_case
from tests.support.broker import MosquittoBroker
from tests.support.edge import DEVICE, KEY, Collector
from tests.support.waiting import eventually

PNG = b"\x89PNG\r\n\x1a\n" + b"pixels"


def _telemetry(seq: int, ts: datetime | None = None) -> Serialised:
    return serialise(
        DeviceTelemetry(
            device_id=DEVICE,
            seq=seq,
            ts=ts or utcnow(),
            uptime_s=1.0,
            escalations=EscalationCounters(sent=0, pending=0, dropped=0),
            outbox_depth=0,
            cpu_pct=1.0,
            ram_used_mb=1.0,
        )
    )


def _uplink(
    broker: MosquittoBroker,
    box: Outbox,
    wall_clock: Callable[[], float] = time.time,
    **settings: float,
) -> Uplink:
    return Uplink(
        MqttSettings(host=broker.host, port=broker.port, reconnect_min_s=1, reconnect_max_s=1),
        UplinkSettings(**settings),
        device_id=DEVICE,
        key=KEY,
        outbox=box,
        agent_version="test",
        wall_clock=wall_clock,
    )


def test_on_connect_it_says_online_and_a_message_leaves_the_outbox_once_acknowledged(
    broker: MosquittoBroker, tmp_path: Path
) -> None:
    # given a cloud-side collector and an uplink over an empty outbox
    collector = Collector(broker, "cloud-connect")
    box = Outbox(tmp_path / "o.db")
    uplink = _uplink(broker, box).start()
    try:
        # when it connects, then it publishes `online`, retained
        eventually(uplink.connected.is_set, 30, "connection")
        eventually(lambda: any(s.state == "online" for s, _ in collector.statuses), 30, "online")
        # when a message is stored, then it arrives and is removed on its PUBACK
        box.put(_telemetry(7))
        uplink.wake()
        eventually(lambda: box.depth() == 0, 30, "the PUBACK")
        eventually(lambda: [t.seq for t in collector.telemetry] == [7], 30, "the message")
        assert uplink.sent == {"telemetry": 1} and uplink.inflight == 0
    finally:
        uplink.stop()
        collector.close()


def test_messages_stored_while_the_broker_is_down_are_kept_and_sent_on_reconnect(
    own_broker: MosquittoBroker, tmp_path: Path
) -> None:
    # given a live uplink, and a collector whose session the broker keeps across restarts
    collector = Collector(own_broker, "cloud-reconnect")
    box = Outbox(tmp_path / "o.db")
    uplink = _uplink(own_broker, box).start()
    try:
        eventually(uplink.connected.is_set, 30, "connection")
        # when the broker goes away and messages keep coming
        own_broker.stop()
        eventually(lambda: not uplink.connected.is_set(), 30, "the disconnect")
        for seq in range(5):
            box.put(_telemetry(100 + seq))
            uplink.wake()
        # then they wait in the outbox
        assert box.depth() == 5
        # when the broker is back, they are all delivered and leave the outbox
        own_broker.start()
        eventually(uplink.connected.is_set, 30, "reconnection")
        eventually(lambda: box.depth() == 0, 60, "the backlog to drain")
        eventually(lambda: len({t.seq for t in collector.telemetry}) == 5, 30, "all messages")
        assert {t.seq for t in collector.telemetry} == set(range(100, 105))
    finally:
        uplink.stop()
        collector.close()


def test_a_message_stored_long_ago_is_restamped_and_signed_again_when_it_goes(
    broker: MosquittoBroker, tmp_path: Path
) -> None:
    # given a message made 10 minutes ago (the cloud refuses ts more than 300 s off)
    # and an uplink whose wall clock says it has waited that long in the outbox
    collector = Collector(broker, "cloud-restamp")
    box = Outbox(tmp_path / "o.db")
    box.put(_telemetry(42, ts=utcnow() - timedelta(minutes=10)))
    uplink = _uplink(broker, box, wall_clock=lambda: time.time() + 600, restamp_after_s=120)
    # when the uplink connects and sends it
    uplink.start()
    try:
        eventually(lambda: box.depth() == 0, 30, "the PUBACK")
        # then the cloud accepts it: fresh ts, valid signature over the new bytes
        eventually(lambda: [t.seq for t in collector.telemetry] == [42], 30, "the message")
        assert abs((utcnow() - collector.telemetry[0].ts).total_seconds()) < 300
        assert collector.rejected == []
    finally:
        uplink.stop()
        collector.close()


@pytest.fixture
def acl_broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    """A broker whose ACL lets this device publish only its status, not telemetry."""
    acl = tmp_path / "acl"
    acl.write_text(f"topic readwrite ef/v1/{DEVICE}/status\n")
    user = "user root\n" if os.geteuid() == 0 else ""  # so it can read the ACL file here
    broker = MosquittoBroker(tmp_path / "mq", extra_config=f"{user}acl_file {acl}").start()
    yield broker
    broker.kill()


def test_a_refused_publish_stays_in_the_outbox_until_accepted(
    acl_broker: MosquittoBroker, tmp_path: Path
) -> None:
    # given an uplink whose broker refuses telemetry (PUBACK 0x87 not authorized)
    box = Outbox(tmp_path / "o.db")
    uplink = _uplink(acl_broker, box, resend_after_s=1).start()
    refused_before = sum(
        s.value for m in NACKED.collect() for s in m.samples if s.name.endswith("_total")
    )
    try:
        eventually(uplink.connected.is_set, 30, "connection")
        box.put(_telemetry(1))
        uplink.wake()
        # then the broker's refusal is counted and the message is kept
        eventually(
            lambda: (
                sum(
                    s.value
                    for m in NACKED.collect()
                    for s in m.samples
                    if s.name.endswith("_total")
                )
                > refused_before
            ),
            30,
            "a refused PUBACK",
        )
        assert box.depth() == 1
        # when the broker is reconfigured to accept it, it is delivered and removed
        (tmp_path / "acl").write_text(f"topic readwrite ef/v1/{DEVICE}/#\n")
        acl_broker.restart()
        collector = Collector(acl_broker, "cloud-acl")
        eventually(lambda: box.depth() == 0, 60, "delivery after the ACL change")
        eventually(lambda: [t.seq for t in collector.telemetry] == [1], 30, "the message")
        collector.close()
    finally:
        uplink.stop()


def test_replay_after_an_outage_is_paced_and_live_messages_overtake_it(
    broker: MosquittoBroker, tmp_path: Path
) -> None:
    # given 60 telemetry messages stored while the uplink was away (as after a restart)
    box = Outbox(tmp_path / "o.db")
    for seq in range(60):
        box.put(_telemetry(1000 + seq))
    collector = Collector(broker, "cloud-replay")
    # when the uplink starts with a replay pace of 10 messages per second
    uplink = _uplink(broker, box, replay_rate_per_s=10).start()
    try:
        eventually(uplink.connected.is_set, 30, "connection")
        eventually(lambda: len(collector.telemetry) >= 2, 30, "the replay to start")
        box.put(_telemetry(5000))
        uplink.wake()
        eventually(lambda: box.depth() == 0, 60, "the backlog to drain")
        eventually(lambda: len(collector.telemetry) == 61, 30, "all messages")
        # then the live message arrived before most of the backlog
        seqs = [t.seq for t in collector.telemetry]
        assert seqs.index(5000) < 40
        assert sorted(s for s in seqs if s < 5000) == list(range(1000, 1060))
    finally:
        uplink.stop()
        collector.close()


def test_a_case_the_broker_acked_then_lost_in_a_crash_is_sent_again(tmp_path: Path) -> None:
    # given a broker that saves its state rarely, and a cloud session subscribed but away
    # (so the broker holds the case in memory for it after its PUBACK)
    broker = MosquittoBroker(tmp_path / "mq", extra_config="autosave_interval 3600").start()
    collector = Collector(broker, "cloud-away")
    collector.client.disconnect()
    collector.client.loop_stop()
    box = Outbox(tmp_path / "o.db")
    uplink = _uplink(broker, box, resend_unanswered_s=1).start()
    try:
        eventually(uplink.connected.is_set, 30, "connection")
        case = escalation_case(DEVICE)
        box.put(serialise_case(case, PNG)[1])
        uplink.wake()
        # when the broker has acknowledged it (it left the line, a copy waits for the answer)
        eventually(
            lambda: box.depth() == 0 and box.answers.waiting() == 1, 30, "the broker's PUBACK"
        )
        # and the broker is killed before it saved or delivered the case, then restarted
        broker.kill()
        broker.start()
        back = Collector(broker, "cloud-away")
        # then the unanswered case is sent again and reaches the cloud
        eventually(lambda: case.case_id in back.cases or back.rejected, 60, "the case sent again")
        assert back.rejected == [] and back.cases[case.case_id][1] == PNG
        # and once its verdict arrives the copy goes
        assert box.answers.answered(case.case_id) and box.answers.waiting() == 0
        back.close()
    finally:
        uplink.stop(publish_offline=False)
        box.close()
        broker.kill()
