"""Every in-memory cache, replay window and per-device table is bounded by count and bytes:
each is filled past its bounds here, and its gauges and eviction counter must say so."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client import REGISTRY

from edgefleet.cloud.cache import Cached, CacheKey, VerdictCache
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.shared.bounded import BoundedMap
from edgefleet.shared.db import Database
from edgefleet.shared.messages import Detection
from edgefleet.shared.wire import ReplayGuard


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def gauge(metric: str, name: str) -> float | None:
    return REGISTRY.get_sample_value(metric, {"name": name})


@contextlib.contextmanager
def gauge_growth(metric: str, **labels: str) -> Iterator[Callable[[], float]]:
    """How much the gauge grew within the block: its value sums every live object it reads,
    and those of earlier tests may still live (collected first, and not during the block)."""

    def value() -> float:
        return REGISTRY.get_sample_value(metric, labels) or 0.0

    gc.collect()
    gc.disable()
    try:
        before = value()
        yield lambda: value() - before
    finally:
        gc.enable()


def evicted(name: str, reason: str) -> float:
    return (
        REGISTRY.get_sample_value("ef_bounded_evictions_total", {"name": name, "reason": reason})
        or 0.0
    )


def test_count_bound_keeps_the_newest_and_counts_the_rest() -> None:
    # given a map of at most 10 entries
    m: BoundedMap[int, str] = BoundedMap(
        "t_count", max_entries=10, max_bytes=10**9, size_of=lambda k, v: 1
    )
    before = evicted("t_count", "full")
    # when 25 are put
    for i in range(25):
        m.put(i, str(i))
    # then the 10 newest stay, 15 were evicted as `full`, and the gauges say 10
    assert len(m) == 10
    assert m.get(14) is None and m.get(15) == "15" and m.get(24) == "24"
    assert evicted("t_count", "full") - before == 15
    assert gauge("ef_bounded_entries", "t_count") == 10
    assert gauge("ef_bounded_bytes", "t_count") == 10


def test_byte_bound_holds_whatever_the_count() -> None:
    # given a map of 1,000 bytes where each entry costs its value's length
    m: BoundedMap[int, bytes] = BoundedMap(
        "t_bytes", max_entries=10**6, max_bytes=1000, size_of=lambda k, v: len(v)
    )
    # when 500 entries of 30 bytes are put, and one of 2,000 bytes
    for i in range(500):
        m.put(i, b"x" * 30)
    assert m.put(-1, b"x" * 2000) is False
    # then it holds 33 entries (990 bytes), never more than its bound
    assert m.bytes == 990 and len(m) == 33
    assert gauge("ef_bounded_bytes", "t_bytes") == 990
    # and replacing an entry accounts for the old one's bytes
    m.put(499, b"y" * 10)
    assert m.bytes == 970


def test_time_to_live_expires_from_the_front_and_on_read() -> None:
    clock = Clock()
    m: BoundedMap[str, int] = BoundedMap(
        "t_ttl", max_entries=100, max_bytes=10**6, size_of=lambda k, v: 1, ttl_s=10, clock=clock
    )
    before = evicted("t_ttl", "expired")
    m.put("a", 1)
    clock.now = 5
    m.put("b", 2)
    clock.now = 11
    # then `a` has expired (on read), `b` not yet
    assert m.get("a") is None and m.get("b") == 2
    clock.now = 16
    m.expire()
    assert len(m) == 0
    assert evicted("t_ttl", "expired") - before == 2


def test_touch_makes_it_least_recently_used() -> None:
    m: BoundedMap[str, int] = BoundedMap(
        "t_lru", max_entries=2, max_bytes=100, size_of=lambda k, v: 1, touch=True
    )
    m.put("a", 1)
    m.put("b", 2)
    assert m.get("a") == 1  # `a` is now the most recently used
    m.put("c", 3)
    assert m.get("b") is None and m.get("a") == 1 and m.get("c") == 3


def test_replay_guard_past_its_bound_stays_bounded_and_still_catches_recent_replays() -> None:
    # given a replay window of 60 s holding at most 1,000 keys
    clock = Clock()
    guard = ReplayGuard(window_s=60, max_entries=1000, name="t_replay", clock=clock)
    before = evicted("t_replay", "full")
    # when 5,000 telemetry seqs arrive inside the window
    for seq in range(5000):
        assert guard.check_and_add("cam-1", "seq", str(seq)) is True
    # then it holds 1,000, counts 4,000 pushed out early, and a recent replay is refused
    assert len(guard) == 1000
    assert evicted("t_replay", "full") - before == 4000
    assert guard.check_and_add("cam-1", "seq", "4999") is False
    assert gauge("ef_bounded_entries", "t_replay") == 1000
    assert 0 < (gauge("ef_bounded_bytes", "t_replay") or 0) <= 256 * 2**20
    # and once the window has passed, everything has expired
    clock.now = 61
    assert guard.check_and_add("cam-1", "seq", "5000") is True
    assert len(guard) == 1


def test_replay_guard_byte_bound() -> None:
    guard = ReplayGuard(window_s=600, max_entries=10**6, max_bytes=100_000, name="t_replay_b")
    for i in range(5000):
        guard.check_and_add(f"device-{i % 100:03d}", "case_id", f"{i:032x}")
    assert 0 < len(guard) < 5000
    assert (gauge("ef_bounded_bytes", "t_replay_b") or 0) <= 100_000


def test_verdict_cache_is_bounded_by_bytes_too() -> None:
    with gauge_growth("ef_bounded_bytes", name="verdict_cache") as growth:
        # given a cache of up to 10,000 verdicts but 200 kB
        cache = VerdictCache(size=10_000, min_score=0.5, max_bytes=200_000)
        long_line = Detection(text="W" * 500, score=0.99, box=(0.0, 0.0, 10.0, 10.0))
        # when 1,000 verdicts of four long lines are put
        for i in range(1000):
            cache.put(CacheKey(f"{i:064x}", "m@1", "default"), Cached((long_line,) * 4, "m@1", 0))
        # then it keeps what fits in 200 kB, the newest
        assert 0 < len(cache) < 1000 and cache.bytes <= 200_000
        assert cache.get(CacheKey(f"{999:064x}", "m@1", "default")) is not None
        assert growth() == cache.bytes


def test_registry_key_cache_is_bounded(tmp_path: Path) -> None:
    with gauge_growth("ef_bounded_entries", name="device_keys") as growth:
        # given a registry whose key cache holds 3 devices
        db = Database.connect(f"sqlite:///{tmp_path / 'fleet.db'}")
        registry = DeviceRegistry(db, key_cache_entries=3, key_cache_s=60)
        keys = {f"cam-{i}": registry.enroll(f"cam-{i}").device_key for i in range(8)}
        # when every device's key is looked up
        for device_id, key in keys.items():
            assert registry.device_key(device_id) == key
        # then the cache holds 3 (the rest come from the store again) and says so
        assert growth() == 3
    assert registry.device_key("cam-0") == keys["cam-0"]
    db.close()


def test_ingest_light_queue_drops_qos0_past_its_byte_bound() -> None:
    from tests.support.cloud import deliver_telemetry, idle_ingest

    # given an ingest (not started: nothing drains its queue) allowed 2,000 payload bytes
    key = bytes(32)
    dropped = (
        REGISTRY.get_sample_value(
            "ef_cloud_ingest_total", {"channel": "telemetry", "outcome": "dropped_full"}
        )
        or 0.0
    )
    with (
        gauge_growth("ef_cloud_light_queue_bytes") as held,
        gauge_growth("ef_cloud_light_queue_depth") as waiting,
    ):
        ingest = idle_ingest(key, light_queue_bytes=2_000)

        def deliver(seq: int, qos: int) -> int:
            return deliver_telemetry(ingest, key, seq, qos)

        # when 20 QoS 0 messages arrive
        size = max(deliver(seq, qos=0) for seq in range(20))
        # then what waits stays within 2,000 bytes and the rest is counted as dropped
        assert 2_000 - size < held() <= 2_000
        now_dropped = REGISTRY.get_sample_value(
            "ef_cloud_ingest_total", {"channel": "telemetry", "outcome": "dropped_full"}
        )
        assert now_dropped is not None and now_dropped - dropped == 20 - waiting() > 0
        # and a QoS 1 message is still taken (the broker bounds those: receive_maximum)
        deliver(100, qos=1)
        assert held() > 2_000


def test_drift_gauges_follow_the_devices_that_have_readings() -> None:
    from datetime import datetime

    from edgefleet.cloud.drift import DriftWatch
    from edgefleet.cloud.settings import DriftSettings

    class Scores:
        """A store's edge scores per (device, model), the same in both windows."""

        def __init__(self, pairs: list[tuple[str, str]]) -> None:
            self.pairs = pairs

        def edge_scores(self, start: datetime, end: datetime) -> dict[tuple[str, str], list[float]]:
            return {pair: [0.5] * 30 for pair in self.pairs}

    store = Scores([("gone-1", "m"), ("kept-1", "m")])
    watch = DriftWatch(store, DriftSettings())  # type: ignore[arg-type]  # its scores are all it reads
    watch.compute()
    labels = {"device": "gone-1", "model": "m"}
    assert REGISTRY.get_sample_value("ef_cloud_edge_score_drift_ks", labels) == 0.0
    # when a device no longer has a reading (revoked, silent), its gauge child goes too
    store.pairs = [("kept-1", "m")]
    watch.compute()
    assert REGISTRY.get_sample_value("ef_cloud_edge_score_drift_ks", labels) is None
    assert (
        REGISTRY.get_sample_value(
            "ef_cloud_edge_score_drift_ks", {"device": "kept-1", "model": "m"}
        )
        == 0.0
    )
