"""The ingest's pieces through their own constructors: the window of acknowledgements and
the sink of light messages (the Ingest composes them: tests/unit/test_ingest_batching.py,
tests/integration/test_cloud_mqtt*.py)."""

from __future__ import annotations

from edgefleet.cloud.acks import Acks
from edgefleet.cloud.light import LightSink
from edgefleet.cloud.registry import StaticRegistry
from edgefleet.shared.messages import ReportedState
from edgefleet.shared.wire import Verified
from tests.support.cloud import telemetry
from tests.support.waiting import eventually


class Recorded:
    """Where the acknowledgements go: the broker connection's `ack`, recorded."""

    def __init__(self) -> None:
        self.acked: list[tuple[int, int]] = []

    def ack(self, mid: int, qos: int) -> None:
        self.acked.append((mid, qos))


def _telemetry(seq: int) -> Verified:
    return Verified(telemetry(seq), None, "cam-01")


def test_the_window_is_full_at_receive_maximum_and_only_qos_1_is_acknowledged() -> None:
    client = Recorded()
    acks = Acks(client, receive_maximum=2)  # type: ignore[arg-type]
    acks.taken()
    assert not acks.full()
    acks.taken()
    assert acks.full()
    acks.ack(7, 1)
    acks.ack(8, 0)  # QoS 0: nothing owed, nothing sent
    assert not acks.full() and client.acked == [(7, 1)]


def test_the_sink_stores_then_acknowledges_and_drops_qos_0_when_full() -> None:
    client, registry, counted, reported = Recorded(), StaticRegistry(), [], []
    acks = Acks(client, receive_maximum=64)  # type: ignore[arg-type]
    sink = LightSink(
        registry,
        acks,
        lambda channel, outcome: counted.append((channel, outcome)),
        max_messages=2,
        max_bytes=1 << 20,
        workers=1,
        batch_max=10,
        flush_s=0.0,
        on_reported=reported.append,
    )
    # given three messages handed over before the worker runs: the third, QoS 0, finds
    # the sink full and is dropped (QoS 1 ones are bounded by the broker's window)
    sink.offer(_telemetry(1), 1, 1, 100, "telemetry")
    sink.offer(_telemetry(2), 2, 1, 100, "telemetry")
    sink.offer(_telemetry(3), 3, 0, 100, "telemetry")
    assert counted == [("telemetry", "dropped_full")] and sink.waiting() == 2
    state = ReportedState(device_id="cam-01", deployment_id="d1", image="img", status="healthy")
    # when the worker stores them
    sink.start()
    sink.offer(Verified(state, None, "cam-01"), 4, 1, 50, "reported")
    eventually(lambda: len(client.acked) == 3, what="the stored messages acknowledged")
    sink.stop()
    # then each is stored before its acknowledgement, and the rollout hears the report
    assert registry.last_telemetry["cam-01"].seq == 2
    assert registry.last_reported["cam-01"] == state and reported == [state]
    assert sorted(client.acked) == [(1, 1), (2, 1), (4, 1)]
    assert counted.count(("telemetry", "stored")) == 2 and ("reported", "stored") in counted
