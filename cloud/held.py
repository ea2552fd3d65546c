"""MQTT redeliveries held back to be checked again later, on one thread, bounded by count.

A case the broker delivers while another worker or replica owns its claim is not acked
until its owner answers (see `CaseRunner.process`): it is held here and handed back to
the queue when its recheck is due. One heap of due times and one thread serve them all, so
a burst of redeliveries costs entries in a heap, not a thread each.

At `max_entries` a redelivery is refused (`hold` returns False, counted in
`ef_cloud_held_full_total`): the caller answers it without a verdict, which acks the
message. The case is not lost by that: its claim and image are in the store, so its owner
publishes the verdict, or the stale sweep runs it again if the owner dies. Leaving the
message un-acked without holding it would instead pin one of the broker's
`receive_maximum` slots for the rest of the session (MQTT 5 redelivers only on reconnect).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge

from edgefleet.shared.gauges import observe

ENTRIES = Gauge("ef_cloud_held_entries", "MQTT redeliveries held to be checked again")
BYTES = Gauge("ef_cloud_held_bytes", "Payload bytes of the held MQTT redeliveries")
FULL = Counter(
    "ef_cloud_held_full_total",
    "Redeliveries not held because the bound was reached (answered without a verdict: "
    "acked; the owner or the stale sweep answers the case)",
)

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class HeldRedeliveries(Generic[K, T]):
    """Items due again after a delay; `due()` pops those whose time has come. Thread-safe."""

    def __init__(self, *, max_entries: int, clock: Callable[[], float] = time.monotonic):
        self.max_entries = max_entries
        self._clock = clock
        self._heap: list[tuple[float, int, K, T, int]] = []
        self._seq = itertools.count()
        self._keys: Tally[K] = Tally()
        self._bytes = 0
        self._changed = threading.Condition()
        self._stopped = False
        observe(ENTRIES, self, len)
        observe(BYTES, self, lambda held: held._bytes)

    def __len__(self) -> int:
        return len(self._heap)

    @property
    def bytes(self) -> int:
        return self._bytes

    def holds(self, key: K) -> bool:
        with self._changed:
            return key in self._keys

    def hold(self, key: K, item: T, *, size: int, after_s: float) -> bool:
        """Hold `item` until `after_s` from now; False (counted) when the bound is reached."""
        with self._changed:
            if len(self._heap) >= self.max_entries:
                FULL.inc()
                return False
            heapq.heappush(self._heap, (self._clock() + after_s, next(self._seq), key, item, size))
            self._keys[key] += 1
            self._bytes += size
            self._changed.notify()
        return True

    def due(self) -> list[T]:
        """Pop every item whose time has come, earliest first."""
        with self._changed:
            return self._pop_due(self._clock())

    def run(self, release: Callable[[T], None]) -> None:
        """Hand each item to `release` when it is due, until `stop()`: the one thread."""
        while True:
            with self._changed:
                if self._stopped:
                    return
                now = self._clock()
                ready = self._pop_due(now)
                if not ready:
                    wait_s = self._heap[0][0] - now if self._heap else None
                    self._changed.wait(wait_s)
                    continue
            for item in ready:
                release(item)

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify()

    def _pop_due(self, now: float) -> list[T]:
        ready = []
        while self._heap and self._heap[0][0] <= now:
            _, _, key, item, size = heapq.heappop(self._heap)
            self._keys[key] -= 1
            if self._keys[key] <= 0:
                del self._keys[key]
            self._bytes -= size
            ready.append(item)
        return ready
