"""The uplink's sender state machine, driven by an injected clock over a real outbox:
live first, backlog paced, ack removes, a refused or missing PUBACK sends the row again,
a reconnect starts a new backlog segment."""

from __future__ import annotations

from pathlib import Path

from edgefleet.edge.delivery import Delivery
from edgefleet.edge.outbox import Outbox
from edgefleet.shared.wire import Serialised


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _put(box: Outbox, n: int = 1) -> list[int]:
    return [box.put(Serialised("ef.telemetry/1", b"{}")) for _ in range(n)]


def _delivery(box: Outbox, clock: Clock, **overrides: float) -> Delivery:
    settings = {"replay_rate_per_s": 10.0, "resend_after_s": 60.0, "max_inflight": 100}
    settings.update(overrides)
    return Delivery(
        box,
        replay_rate_per_s=settings["replay_rate_per_s"],
        resend_after_s=settings["resend_after_s"],
        max_inflight=int(settings["max_inflight"]),
        clock=clock,
    )


def _ids(delivery: Delivery, *, mid_from: int = 1) -> list[int]:
    """One batch's row ids, each recorded in flight (QoS 1) under consecutive mids."""
    batch = delivery.next_batch()
    for offset, item in enumerate(batch):
        delivery.published(item, mid_from + offset, qos=1)
    return [item.id for item in batch]


def test_live_rows_go_at_once_and_the_backlog_at_the_replay_pace(tmp_path: Path) -> None:
    # given five rows stored before the connection (backlog), a replay pace of 10/s
    box, clock = Outbox(tmp_path / "o.db"), Clock()
    backlog = _put(box, 5)
    delivery = _delivery(box, clock)
    delivery.connected()
    # when nothing has been saved up yet, then no backlog row goes
    assert _ids(delivery) == []
    # when a live row is stored, then it goes at once, ahead of the backlog
    live = _put(box)
    assert _ids(delivery, mid_from=1) == live
    # when 0.2 s pass, then two backlog rows go, oldest first, and no more
    clock.advance(0.2)
    assert _ids(delivery, mid_from=10) == backlog[:2]
    assert _ids(delivery, mid_from=20) == []
    # when 5 s pass, the three left go (tokens saved up are capped at one second's worth)
    clock.advance(5)
    assert _ids(delivery, mid_from=30) == backlog[2:]
    assert delivery.inflight == 6


def test_a_good_puback_removes_the_row_and_counts_it_sent(tmp_path: Path) -> None:
    box, clock = Outbox(tmp_path / "o.db"), Clock()
    delivery = _delivery(box, clock)
    delivery.connected()
    (row,) = _put(box)
    assert _ids(delivery, mid_from=7) == [row]
    # when the broker acknowledges it, then it leaves the outbox
    delivery.acked([(7, True, "Success")])
    assert box.depth() == 0 and delivery.inflight == 0
    assert delivery.sent == {"telemetry": 1}
    # and a late duplicate PUBACK of the same id changes nothing
    delivery.acked([(7, True, "Success")])
    assert delivery.sent == {"telemetry": 1}


def test_a_refused_puback_keeps_the_row_and_sends_it_again(tmp_path: Path) -> None:
    box, clock = Outbox(tmp_path / "o.db"), Clock()
    delivery = _delivery(box, clock)
    delivery.connected()
    (row,) = _put(box)
    assert _ids(delivery, mid_from=1) == [row]
    # when the broker refuses it (PUBACK 0x87 not authorized)
    delivery.acked([(1, False, "Not authorized")])
    # then it stays, and goes again (as backlog, at the replay pace)
    assert box.depth() == 1 and delivery.sent == {}
    clock.advance(0.1)
    assert _ids(delivery, mid_from=2) == [row]


def test_no_puback_within_resend_after_sends_the_row_again(tmp_path: Path) -> None:
    box, clock = Outbox(tmp_path / "o.db"), Clock()
    delivery = _delivery(box, clock, resend_after_s=60.0)
    delivery.connected()
    (row,) = _put(box)
    assert _ids(delivery, mid_from=1) == [row]
    # while the wait is shorter than resend_after_s, it is not sent twice
    clock.advance(59)
    assert _ids(delivery, mid_from=2) == []
    # when it is longer, the row goes again under a new id, and the late PUBACK of the
    # first id no longer settles anything
    clock.advance(2)
    assert _ids(delivery, mid_from=3) == [row]
    delivery.acked([(1, True, "Success")])
    assert box.depth() == 1
    delivery.acked([(3, True, "Success")])
    assert box.depth() == 0


def test_a_reconnect_makes_what_was_stored_backlog_and_restarts_the_resend_clock(
    tmp_path: Path,
) -> None:
    # given one row in flight when the connection dropped, and two stored while it was down
    box, clock = Outbox(tmp_path / "o.db"), Clock()
    delivery = _delivery(box, clock, resend_after_s=60.0)
    delivery.connected()
    (in_flight,) = _put(box)
    assert _ids(delivery, mid_from=1) == [in_flight]
    stored_offline = _put(box, 2)
    clock.advance(120)  # down for longer than resend_after_s
    # when the connection is back
    delivery.connected()
    # then the row in flight is not sent again at once (paho resends it in the session),
    # the rows stored while down are backlog (paced), and a new row is live
    live = _put(box)
    assert _ids(delivery, mid_from=10) == live
    clock.advance(0.2)
    assert _ids(delivery, mid_from=20) == stored_offline
    assert delivery.inflight == 4


def test_the_in_flight_window_bounds_what_is_handed_out(tmp_path: Path) -> None:
    box, clock = Outbox(tmp_path / "o.db"), Clock()
    delivery = _delivery(box, clock, max_inflight=2)
    delivery.connected()
    rows = _put(box, 3)
    assert _ids(delivery, mid_from=1) == rows[:2]
    assert _ids(delivery, mid_from=3) == []
    delivery.acked([(1, True, "Success")])
    assert _ids(delivery, mid_from=4) == rows[2:]


def test_qos_0_rows_are_done_when_handed_over(tmp_path: Path) -> None:
    box, clock = Outbox(tmp_path / "o.db"), Clock()
    delivery = _delivery(box, clock)
    delivery.connected()
    _put(box)
    (item,) = delivery.next_batch()
    delivery.published(item, 1, qos=0)
    assert box.depth() == 0 and delivery.inflight == 0 and delivery.sent == {"telemetry": 1}


def test_replay_tokens_saved_up_are_capped_at_one_seconds_worth(tmp_path: Path) -> None:
    # given 25 backlog rows and a pace of 10/s
    box, clock = Outbox(tmp_path / "o.db"), Clock()
    backlog = _put(box, 25)
    delivery = _delivery(box, clock)
    delivery.connected()
    # when 30 s pass with nothing sent, then only 10 go at once
    clock.advance(30)
    assert _ids(delivery, mid_from=1) == backlog[:10]
    assert _ids(delivery, mid_from=20) == []
