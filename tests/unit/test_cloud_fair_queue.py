"""The cloud's fair queue on its own: priority first, then devices in turn; what it counts
as waiting, queued and claimed (the device quota and the stale sweep read those)."""

from __future__ import annotations

import queue
from dataclasses import dataclass, field

import pytest

from edgefleet.bench.harness import escalation_case
from edgefleet.cloud.fair_queue import FairQueue
from edgefleet.cloud.lookup import case_key
from edgefleet.shared.messages import EscalationCase


@dataclass(order=True)
class Item:
    sort_key: tuple[int, int, int]
    case: EscalationCase = field(compare=False)


def item(q: FairQueue[Item], device: str, index: int, priority: int = 0) -> Item:
    case = escalation_case(device, frame_index=index)
    return Item(q.sort_key(priority, device), case)


def drain(q: FairQueue[Item]) -> list[tuple[str, int]]:
    out = []
    while True:
        try:
            taken = q.get_nowait()
        except queue.Empty:
            return out
        out.append((taken.case.device_id, taken.case.frame_index))


def test_devices_take_turns_so_a_flood_does_not_push_the_others_back() -> None:
    q: FairQueue[Item] = FairQueue()
    # given a device that floods five cases, then two devices with one each
    for i in range(5):
        q.put(item(q, "flood", i))
    q.put(item(q, "a", 0))
    q.put(item(q, "b", 0))
    # then the first case of each device comes before the flood's second
    assert drain(q)[:3] == [("flood", 0), ("a", 0), ("b", 0)]


def test_priority_comes_before_turns() -> None:
    q: FairQueue[Item] = FairQueue()
    q.put(item(q, "a", 0))
    q.put(item(q, "a", 1))
    q.put(item(q, "b", 0, priority=5))
    assert drain(q) == [("b", 0), ("a", 0), ("a", 1)]


def test_a_device_that_comes_back_later_joins_at_the_slot_being_served() -> None:
    q: FairQueue[Item] = FairQueue()
    for i in range(4):
        q.put(item(q, "busy", i))
    assert [q.get(timeout=1).case.frame_index for _ in range(2)] == [0, 1]
    # a device quiet until now is not owed the slots it missed: it goes after the one
    # being served, not before every case already queued
    q.put(item(q, "late", 0))
    assert drain(q) == [("busy", 2), ("late", 0), ("busy", 3)]


def test_waiting_counts_a_place_until_its_case_is_taken_or_released() -> None:
    q: FairQueue[Item] = FairQueue()
    first = item(q, "cam", 0)
    item(q, "cam", 1)  # a place given to a case that is then refused
    assert q.waiting("cam") == 2
    q.release("cam")
    assert q.waiting("cam") == 1
    q.put(first)
    assert len(q) == 1
    q.get(timeout=1)
    assert q.waiting("cam") == 0 and len(q) == 0
    # a put-back case waits again, in its old place
    q.requeue(first)
    assert q.waiting("cam") == 1
    assert q.get(timeout=1) is first


def test_the_sweep_reserves_a_case_only_when_nothing_else_has_it() -> None:
    q: FairQueue[Item] = FairQueue()
    queued = item(q, "cam", 0)
    q.put(queued)
    claimed = case_key(escalation_case("cam", frame_index=1))
    q.claimed(claimed)
    held = case_key(escalation_case("cam", frame_index=2))
    fresh = case_key(escalation_case("cam", frame_index=3))

    def holds(key: object) -> bool:
        return key == held

    # queued, claimed or held elsewhere: not reserved
    assert not q.reserve(case_key(queued.case), holds)
    assert not q.reserve(claimed, holds)
    assert not q.reserve(held, holds)
    # a case nobody has is reserved once: a second sweep skips it until it is taken
    assert q.reserve(fresh, holds)
    assert not q.reserve(fresh, holds)
    # settled, a claimed case may be swept again
    q.settled(claimed)
    assert q.reserve(claimed, holds)


def test_a_reserved_case_is_put_without_counting_it_twice() -> None:
    q: FairQueue[Item] = FairQueue()
    swept = item(q, "cam", 0)
    key = case_key(swept.case)
    assert q.reserve(key, lambda _: False)
    q.put_reserved(swept)
    assert q.get(timeout=1) is swept
    # taken: no longer queued, so a later sweep may reserve it again
    assert q.reserve(key, lambda _: False)


def test_an_empty_queue_times_out() -> None:
    q: FairQueue[Item] = FairQueue()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.01)
