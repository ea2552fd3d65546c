"""The cases waiting for a worker: by priority first, then devices in turn.

Each device's next case takes the slot after its previous one, and never one before the
slot being served, so within a priority devices take turns (round robin) and one device's
flood cannot push the others back. The queue also knows which cases are queued or claimed
and not yet answered, so that the stale sweep does not queue the same case twice.
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from edgefleet.cloud.lookup import CaseKey, case_key
from edgefleet.shared.messages import EscalationCase

# devices with nothing queued are forgotten once this many are known
MAX_DEVICES = 10_000


class Queued(Protocol):
    """What the queue orders: (-priority, the device's slot, arrival), and whose case it is."""

    @property
    def sort_key(self) -> tuple[int, int, int]: ...

    @property
    def case(self) -> EscalationCase: ...

    def __lt__(self, other: Any) -> bool: ...


T = TypeVar("T", bound=Queued)


class FairQueue(Generic[T]):
    def __init__(self) -> None:
        self._queue: queue.PriorityQueue[T] = queue.PriorityQueue()
        self._arrivals = itertools.count()
        self._lock = threading.Lock()
        self._slots: dict[str, int] = {}
        self._waiting: collections.Counter[str] = collections.Counter()
        self._served = 0
        self._queued: collections.Counter[CaseKey] = collections.Counter()
        self._claimed: set[CaseKey] = set()  # claimed when admitted, not answered yet

    def __len__(self) -> int:
        return self._queue.qsize()

    def sort_key(self, priority: int, device_id: str) -> tuple[int, int, int]:
        """The place of a device's next case; the device counts it as waiting from now
        (`release` gives the place back if the case is refused before it is put)."""
        with self._lock:
            slot = max(self._slots.get(device_id, 0), self._served) + 1
            self._slots[device_id] = slot
            self._waiting[device_id] += 1
            if len(self._slots) > MAX_DEVICES:
                self._slots = {d: s for d, s in self._slots.items() if s > self._served}
        return (-priority, slot, next(self._arrivals))

    def waiting(self, device_id: str) -> int:
        """The device's cases that have a place and have not been taken yet."""
        with self._lock:
            return self._waiting[device_id]

    def release(self, device_id: str) -> None:
        """A case refused before it was put gives its device's place back."""
        with self._lock:
            self._forget_one(device_id)

    def put(self, item: T) -> None:
        with self._lock:
            self._queued[case_key(item.case)] += 1
        self._queue.put(item)

    def put_reserved(self, item: T) -> None:
        """Put a case that `reserve` counted as queued already."""
        self._queue.put(item)

    def requeue(self, item: T) -> None:
        """Put a case back in its old place (its slot is kept: it had its turn already)."""
        with self._lock:
            self._waiting[item.case.device_id] += 1
            self._queued[case_key(item.case)] += 1
        self._queue.put(item)

    def get(self, timeout: float | None = None) -> T:
        """The next case (queue.Empty after `timeout`)."""
        return self._taken(self._queue.get(timeout=timeout))

    def get_nowait(self) -> T:
        return self._taken(self._queue.get_nowait())

    def claimed(self, key: CaseKey) -> None:
        """The case is claimed in the store by this replica: not stale until it is settled."""
        with self._lock:
            self._claimed.add(key)

    def settled(self, key: CaseKey) -> None:
        """Answered or failed: a sweep may take the case up again."""
        with self._lock:
            self._claimed.discard(key)

    def reserve(self, key: CaseKey, held: Callable[[CaseKey], bool]) -> bool:
        """Count a stale case as queued, unless it is queued, claimed or `held` already:
        a second sweep then skips it."""
        with self._lock:
            if key in self._claimed or key in self._queued or held(key):
                return False
            self._queued[key] += 1
            return True

    def _taken(self, item: T) -> T:
        with self._lock:
            key = case_key(item.case)
            self._queued[key] -= 1
            if self._queued[key] <= 0:
                del self._queued[key]
            self._served = max(self._served, item.sort_key[1])
            self._forget_one(item.case.device_id)
        return item

    def _forget_one(self, device_id: str) -> None:
        self._waiting[device_id] -= 1
        if self._waiting[device_id] <= 0:
            del self._waiting[device_id]
