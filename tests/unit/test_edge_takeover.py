"""Telling another agent's takeovers from a broker restart, by the connections' lengths."""

from __future__ import annotations

from edgefleet.edge.takeover import TakeoverWatch


def test_a_newcomer_whose_connections_are_all_short_stops_on_the_third_loss() -> None:
    watch = TakeoverWatch(short_s=10)
    results = []
    for start in (0.0, 1.0, 2.0):
        watch.connected(start)
        results.append(watch.lost(start + 0.5))
    assert results == [False, False, True]


def test_the_agent_that_held_its_session_long_never_stops() -> None:
    watch = TakeoverWatch(short_s=10)
    watch.connected(0.0)
    assert not watch.lost(60.0)
    for start in (61.0, 62.0, 63.0, 64.0):
        watch.connected(start)
        assert not watch.lost(start + 0.5)
    assert watch.contested


def test_a_broker_that_refuses_a_connect_in_between_ends_the_streak() -> None:
    watch = TakeoverWatch(short_s=10)
    for start in (0.0, 1.0):
        watch.connected(start)
        assert not watch.lost(start + 0.5)
    watch.failed()  # the broker is down: these were restarts, not another agent
    watch.connected(5.0)
    assert not watch.lost(5.5)


def test_a_loss_before_any_connection_is_not_a_takeover() -> None:
    assert not TakeoverWatch(short_s=10).lost(1.0)
