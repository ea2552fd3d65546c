"""The uplink's pieces through their own constructors: what comes in (verified before any
use) and what goes out (signed, restamped when it waited too long); the uplink itself, on
a real broker: tests/integration/test_edge_uplink.py."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from edgefleet.edge.incoming import Incoming
from edgefleet.edge.outbox import OutboxItem
from edgefleet.edge.stamping import Stamping
from edgefleet.shared.errors import PayloadRejected
from edgefleet.shared.messages import CloudVerdict, utcnow
from edgefleet.shared.topics import Channel, Topics
from edgefleet.shared.wire import Serialised, Verifier, encode, serialise
from tests.support.cloud import telemetry

KEY, OTHER = b"k" * 32, b"o" * 32
TOPICS = Topics()


def _verdict() -> CloudVerdict:
    return CloudVerdict(
        device_id="cam-01",
        trace_id="0" * 32,
        case_id="case-0001",
        result=[],
        model="rules",
        route="default",
        fallback_level=2,
        latency_ms=1.0,
    )


def test_what_comes_in_is_handed_over_only_when_signed_with_the_device_key() -> None:
    got: list[tuple[Channel, object]] = []
    incoming = Incoming(
        TOPICS, "cam-01", KEY, max_skew_s=300, handler=lambda c, v: got.append((c, v.message))
    )
    verdict = _verdict()
    incoming.take(encode(verdict, OTHER, TOPICS.results("cam-01")))  # forged: refused
    incoming.take(encode(verdict, KEY, TOPICS.results("cam-01")))
    assert [(c, m.case_id) for c, m in got] == [(Channel.RESULTS, "case-0001")]


def test_a_failing_handler_does_not_reach_the_network_thread() -> None:
    def fails(channel: Channel, verified: object) -> None:
        raise RuntimeError("the agent's handler broke")

    incoming = Incoming(TOPICS, "cam-01", KEY, max_skew_s=300, handler=fails)
    incoming.take(encode(_verdict(), KEY, TOPICS.results("cam-01")))  # logged, not raised


def _item(message: Serialised, created: float) -> OutboxItem:
    return OutboxItem(id=1, kind="telemetry", message=message, qos=1, retain=False, created=created)


def test_a_row_goes_out_as_stored_unless_it_waited_too_long() -> None:
    stamping = Stamping(TOPICS, "cam-01", KEY, restamp_after_s=120, wall_clock=time.time)
    made = utcnow() - timedelta(minutes=10)
    stored = serialise(telemetry(7, ts=made))
    cloud = Verifier(key_for_device=lambda d: KEY, topics=TOPICS, max_skew_s=300)
    # a row stored just now goes out byte for byte as stored (its own ts, 10 min old)
    as_stored = stamping.wire_of(_item(stored, created=time.time()))
    assert as_stored is not None
    with pytest.raises(PayloadRejected, match=r"ts is \d+ s from now \(> 300\)"):
        cloud.verify(as_stored)
    # a row that waited longer than restamp_after_s gets a fresh ts, signed again
    waited = stamping.wire_of(_item(stored, created=time.time() - 600))
    assert waited is not None
    restamped = cloud.verify(waited).message
    assert restamped.seq == 7 and (utcnow() - restamped.ts).total_seconds() < 60
    # and a row that is not a message is left out
    torn = Serialised("ef.telemetry/1", b"{not json")
    assert stamping.wire_of(_item(torn, created=time.time() - 600)) is None
