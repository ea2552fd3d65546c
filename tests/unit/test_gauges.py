"""A gauge read from live objects reports all of them, and lets go of each with it."""

from __future__ import annotations

import gc

from prometheus_client import CollectorRegistry, Gauge

from edgefleet.shared.bounded import BoundedMap
from edgefleet.shared.gauges import observe


class Queue:
    def __init__(self, depth: int) -> None:
        self.depth = depth


def test_readings_of_live_objects_are_combined_and_leave_with_them() -> None:
    registry = CollectorRegistry()
    depth = Gauge("depth", "queued", registry=registry)
    largest = Gauge("largest", "one store seen twice", registry=registry)
    first, second = Queue(3), Queue(4)
    for owner in (first, second):
        observe(depth, owner, lambda q: q.depth)
        observe(largest, owner, lambda q: q.depth, combine=max)
    del owner
    assert registry.get_sample_value("depth") == 7.0
    assert registry.get_sample_value("largest") == 4.0
    second.depth = 5
    assert registry.get_sample_value("depth") == 8.0
    # an object gone is no longer read, nor kept alive by the gauge
    del second
    gc.collect()
    assert registry.get_sample_value("depth") == 3.0
    assert registry.get_sample_value("largest") == 3.0
    del first
    gc.collect()
    assert registry.get_sample_value("depth") == 0.0


def test_every_bounded_map_of_a_name_is_counted() -> None:
    from prometheus_client import REGISTRY

    def entries() -> float:
        return REGISTRY.get_sample_value("ef_bounded_entries", {"name": "gauge-test"}) or 0.0

    maps = [
        BoundedMap("gauge-test", max_entries=10, max_bytes=1000, size_of=lambda k, v: 1)
        for _ in range(2)
    ]
    maps[0].put("a", 1)
    maps[1].put("b", 2)
    maps[1].put("c", 3)
    assert entries() == 3.0
    maps.pop()
    gc.collect()
    assert entries() == 1.0
