"""The scheduler's waiting requests through their own constructor: turns between tenants,
shedding for urgent work, expiry, closing (the scheduler around them:
tests/unit/test_executor_batcher.py)."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from edgefleet.shared.errors import InferenceTimeout, Overloaded
from edgefleet.shared.executor.lanes import Lanes, Request
from edgefleet.shared.executor.settings import BatcherSettings

SEQ = iter(range(1_000_000))


def request(item: int, tenant: str | None = None, priority: int = 0, deadline: float = 10.0):
    return Request(item, Future(), priority, next(SEQ), 0.0, deadline, deadline, tenant)


def test_tenants_take_turns_and_a_batch_holds_at_most_a_tenants_share() -> None:
    lanes: Lanes[int] = Lanes("turns", BatcherSettings(max_batch_per_tenant=2))
    for item in (1, 2, 3, 4):
        lanes.add(request(item, "flood"))
    lanes.add(request(10, "quiet"))
    first = lanes.pop_batch(8)
    assert [r.item for r in first] == [1, 10, 2]  # turns; the flood stops at its share
    assert lanes.depth() == 2 and [r.item for r in lanes.pop_batch(8)] == [3, 4]
    assert lanes.oldest() is None and lanes.depth() == 0


def test_a_full_queue_sheds_the_newest_of_the_biggest_lower_tenant_or_refuses() -> None:
    lanes: Lanes[int] = Lanes("shed", BatcherSettings(max_queue=3))
    low = [request(i, "a") for i in (1, 2)] + [request(3, "b")]
    for r in low:
        lanes.add(r)
    lanes.shed_for(request(9, "c", priority=1))  # urgent: room is made
    assert isinstance(low[1].future.exception(), Overloaded) and not low[1].waiting
    assert lanes.depth() == 2
    with pytest.raises(Overloaded, match="requests already waiting"):
        lanes.shed_for(request(8, "c", priority=0))  # no more urgent than what waits


def test_expired_requests_are_answered_and_leave_the_queue() -> None:
    lanes: Lanes[int] = Lanes("expiry", BatcherSettings())
    soon, later = request(1, deadline=1.0), request(2, deadline=5.0)
    lanes.add(soon)
    lanes.add(later)
    lanes.expire(now=2.0)
    assert isinstance(soon.future.exception(), InferenceTimeout) and lanes.depth() == 1
    assert lanes.next_deadline() == 5.0


def test_fail_all_answers_each_waiting_request_with_its_own_error() -> None:
    lanes: Lanes[int] = Lanes("close", BatcherSettings(max_queue_per_tenant=2))
    waiting = [request(1, "a"), request(2, "a")]
    for r in waiting:
        lanes.add(r)
    assert lanes.over_share("a") and not lanes.over_share("b") and lanes.tenant_depth("a") == 2
    lanes.fail_all(lambda: RuntimeError("closed"))
    errors = [r.future.exception() for r in waiting]
    assert all(isinstance(e, RuntimeError) for e in errors) and errors[0] is not errors[1]
    assert lanes.depth() == 0 and lanes.oldest() is None
