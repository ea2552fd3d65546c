"""The edge tests' verifying subscriber checks signatures (the helper the edge tests trust)."""

from __future__ import annotations

from edgefleet.shared.messages import DeviceStatus
from edgefleet.shared.mqtt import publish
from edgefleet.shared.topics import Topics
from edgefleet.shared.wire import encode
from tests.support.broker import MosquittoBroker
from tests.support.edge import DEVICE, Collector
from tests.support.waiting import eventually


def test_collector_verifies_and_rejects(broker: MosquittoBroker) -> None:
    # given a collector, when a signed and a badly signed status arrive
    collector = Collector(broker, "collector-self-test")
    topic = Topics().status(DEVICE)
    collector.send(DeviceStatus(device_id=DEVICE, state="online", agent_version="t"), topic)
    bad = encode(DeviceStatus(device_id=DEVICE, state="online", agent_version="t"), b"x", topic)
    publish(collector.client, bad, qos=1).wait_for_publish(10)
    # then one is kept and one rejected
    eventually(lambda: collector.statuses and collector.rejected, 20, "both messages")
    assert "ef-sig" in collector.rejected[0]
    collector.close()
