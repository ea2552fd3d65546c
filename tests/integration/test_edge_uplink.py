"""The uplink against a real Mosquitto: refused PUBACKs keep the message, and the replay
after an outage is paced so live messages overtake the backlog."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.bench.harness import escalation_case
from edgefleet.edge.outbox import Outbox
from edgefleet.edge.settings import UplinkSettings
from edgefleet.edge.uplink import NACKED, Uplink
from edgefleet.shared.messages import DeviceTelemetry, EscalationCounters
from edgefleet.shared.mqtt import MqttSettings
from edgefleet.shared.wire import fit_meta
from tests.integration.test_edge_support import DEVICE, KEY, Collector, wait_for
from tests.support.broker import MosquittoBroker

PNG = b"\x89PNG\r\n\x1a\n" + b"pixels"


def _telemetry(seq: int) -> bytes:
    return (
        DeviceTelemetry(
            device_id=DEVICE,
            seq=seq,
            uptime_s=1.0,
            escalations=EscalationCounters(sent=0, pending=0, dropped=0),
            outbox_depth=0,
            cpu_pct=1.0,
            ram_used_mb=1.0,
        )
        .model_dump_json()
        .encode()
    )


def _uplink(broker: MosquittoBroker, box: Outbox, **settings: float) -> Uplink:
    return Uplink(
        MqttSettings(host=broker.host, port=broker.port, reconnect_min_s=1, reconnect_max_s=1),
        UplinkSettings(**settings),
        device_id=DEVICE,
        key=KEY,
        outbox=box,
        agent_version="test",
    )


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
        wait_for(uplink.connected.is_set, 30, "connection")
        topic = uplink.topics.telemetry(DEVICE)
        box.put("telemetry", topic, _telemetry(1))
        uplink.wake()
        # then the broker's refusal is counted and the message is kept
        wait_for(
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
        wait_for(lambda: box.depth() == 0, 60, "delivery after the ACL change")
        wait_for(lambda: [t.seq for t in collector.telemetry] == [1], 30, "the message")
        collector.close()
    finally:
        uplink.stop()


def test_replay_after_an_outage_is_paced_and_live_messages_overtake_it(
    broker: MosquittoBroker, tmp_path: Path
) -> None:
    # given 60 telemetry messages stored while the uplink was away (as after a restart)
    box = Outbox(tmp_path / "o.db")
    for seq in range(60):
        box.put("telemetry", f"ef/v1/{DEVICE}/telemetry", _telemetry(1000 + seq))
    collector = Collector(broker, "cloud-replay")
    # when the uplink starts with a replay pace of 10 messages per second
    uplink = _uplink(broker, box, replay_rate_per_s=10).start()
    try:
        wait_for(uplink.connected.is_set, 30, "connection")
        wait_for(lambda: len(collector.telemetry) >= 2, 30, "the replay to start")
        box.put("telemetry", uplink.topics.telemetry(DEVICE), _telemetry(5000))
        uplink.wake()
        wait_for(lambda: box.depth() == 0, 60, "the backlog to drain")
        wait_for(lambda: len(collector.telemetry) == 61, 30, "all messages")
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
        wait_for(uplink.connected.is_set, 30, "connection")
        case = escalation_case(DEVICE)
        box.put("escalation", uplink.topics.escalations(DEVICE), fit_meta(case)[1], PNG)
        uplink.wake()
        # when the broker has acknowledged it (it left the line, a copy waits for the answer)
        wait_for(lambda: box.depth() == 0 and box.awaiting() == 1, 30, "the broker's PUBACK")
        # and the broker is killed before it saved or delivered the case, then restarted
        broker.kill()
        broker.start()
        back = Collector(broker, "cloud-away")
        # then the unanswered case is sent again and reaches the cloud
        wait_for(lambda: case.case_id in back.cases or back.rejected, 60, "the case sent again")
        assert back.rejected == [] and back.cases[case.case_id][1] == PNG
        # and once its verdict arrives the copy goes
        assert box.answered(case.case_id) and box.awaiting() == 0
        back.close()
    finally:
        uplink.stop(publish_offline=False)
        box.close()
        broker.kill()
