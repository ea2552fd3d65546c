"""What refused requests cost a device: a budget per minute, so refusals are not free.

A refused case (a duplicate `case_id`, an image that will not decode, a quota already full)
costs the cloud a parse, a hash and a store look-up. Each one a device earns is charged to
it; past `per_minute` of them in a minute, its next requests are refused at once with a
429 before any of that work, until the minute rolls over.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

from prometheus_client import Counter

from edgefleet.shared.bounded import ENTRY_OVERHEAD, BoundedMap
from edgefleet.shared.errors import Overloaded

CHARGED = Counter(
    "ef_cloud_refusals_charged_total", "Refused requests charged to a device's refusal budget"
)
SPENT = Counter(
    "ef_cloud_refusal_budget_spent_total",
    "Requests refused at once because the device had spent its refusal budget",
)


class RefusalBudget:
    """Refusals per device in the current minute; thread-safe, bounded in devices."""

    def __init__(
        self,
        per_minute: int,
        *,
        max_devices: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.per_minute = per_minute
        self._clock = clock
        self._lock = threading.Lock()
        self._spent: BoundedMap[str, tuple[int, int]] = BoundedMap(
            "refusal_budget",
            max_entries=max_devices,
            max_bytes=64 * 2**20,
            size_of=lambda key, _: sys.getsizeof(key) + ENTRY_OVERHEAD,
        )

    def _minute(self) -> int:
        return int(self._clock() // 60)

    def check(self, device_id: str) -> None:
        """Overloaded (429, Retry-After: the rest of the minute) once the budget is spent."""
        minute = self._minute()
        spent = self._spent.get(device_id)
        if spent is not None and spent[0] == minute and spent[1] >= self.per_minute:
            SPENT.inc()
            left = 60 - self._clock() % 60
            raise Overloaded(
                f"device {device_id} had {spent[1]} requests refused this minute (its budget)",
                retry_after_s=max(1.0, left),
            )

    def charge(self, device_id: str) -> None:
        """One more refusal for the device this minute."""
        CHARGED.inc()
        minute = self._minute()
        with self._lock:
            spent = self._spent.get(device_id)
            count = spent[1] + 1 if spent is not None and spent[0] == minute else 1
            self._spent.put(device_id, (minute, count))
