"""The waiting requests of one scheduler: per priority, one FIFO per tenant in turn order,
the counts per priority and per tenant, and the heap of deadlines. Every method expects
the scheduler's lock held (`DynamicBatcher`, edgefleet.shared.executor.batcher)."""

from __future__ import annotations

import collections
import functools
import heapq
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from edgefleet.shared.errors import InferenceTimeout, Overloaded
from edgefleet.shared.executor.metrics import QUEUE_DEPTH, REJECTED
from edgefleet.shared.executor.settings import BatcherSettings

T = TypeVar("T")


@functools.cache
def _depth(batcher: str, priority: int) -> Any:
    """The queue-depth gauge child of one (model, priority)."""
    return QUEUE_DEPTH.labels(batcher, str(priority))


@functools.cache
def rejected(batcher: str, reason: str) -> Any:
    return REJECTED.labels(batcher, reason)


@dataclass(eq=False)
class Request(Generic[T]):
    item: T
    future: Future
    priority: int
    seq: int
    enqueued: float
    deadline: float
    timeout_s: float
    tenant: str | None = None  # who it is for (a device); None: shares one turn, no quota
    waiting: bool = True  # False once taken, expired, shed or failed


class Lanes(Generic[T]):
    def __init__(self, name: str, settings: BatcherSettings) -> None:
        self.name = name
        self.settings = settings
        # per priority, one FIFO per tenant in turn order (a tenant served goes to the back);
        # entries that left early stay until skipped
        self._lanes: dict[int, dict[str, deque[Request[T]]]] = {}
        self._counts: dict[int, int] = {}  # requests waiting, per priority
        self._tenants: collections.Counter[str] = collections.Counter()  # waiting, per tenant
        # heap; stale entries too. Weak: an answered request (and its input, e.g. decoded
        # pixels) is freed when its caller is done, not when its deadline comes round.
        self._deadlines: list[tuple[float, int, weakref.ref[Request[T]]]] = []

    def add(self, request: Request[T]) -> None:
        lane = self._lanes.setdefault(request.priority, {})
        lane.setdefault(request.tenant or "", deque()).append(request)
        self._count(request, +1)
        heapq.heappush(self._deadlines, (request.deadline, request.seq, weakref.ref(request)))

    def tenant_depth(self, tenant: str | None) -> int:
        return self._tenants[tenant or ""]

    def depth(self) -> int:
        return sum(self._counts.values())

    def next_deadline(self) -> float:
        return self._deadlines[0][0]

    def fail_all(self, error: Callable[[], Exception]) -> None:
        """Answer every waiting request with an `error()` of its own; empty the lanes."""
        for lane in self._lanes.values():
            for request in (r for fifo in lane.values() for r in fifo):
                if request.waiting:
                    self.leave(request)
                    request.future.set_exception(error())
        self._lanes.clear()

    def over_share(self, tenant: str | None) -> bool:
        """Whether a named tenant already has its share of the queue waiting (lock held)."""
        share = self.settings.max_queue_per_tenant
        return tenant is not None and share is not None and self._tenants[tenant] >= share

    def retry_after_s(self) -> float:
        return max(0.05, self.settings.max_delay_ms / 1000 * 2)

    def shed_for(self, newcomer: Request[T]) -> None:
        """Make room for `newcomer` in a full queue, or refuse it (lock held)."""
        retry = self.retry_after_s()
        lowest = min(p for p, n in self._counts.items() if n > 0)
        if lowest >= newcomer.priority:
            rejected(self.name, "overloaded").inc()
            raise Overloaded(
                f"{self.name}: {self.depth()} requests already waiting "
                f"(max_queue={self.settings.max_queue})",
                retry_after_s=retry,
            )
        # the newest request of the tenant that holds most at that priority
        fifo = max(self._lanes[lowest].values(), key=lambda q: sum(r.waiting for r in q))
        while not fifo[-1].waiting:
            fifo.pop()
        victim = fifo.pop()
        self.leave(victim)
        rejected(self.name, "shed").inc()
        victim.future.set_exception(
            Overloaded(
                f"{self.name}: queue full; priority {victim.priority} gave way to "
                f"priority {newcomer.priority}",
                retry_after_s=retry,
            )
        )

    def _count(self, request: Request[T], delta: int) -> None:
        count = self._counts.get(request.priority, 0) + delta
        self._counts[request.priority] = count
        _depth(self.name, request.priority).set(count)
        if request.tenant is not None:
            self._tenants[request.tenant] += delta
            if self._tenants[request.tenant] <= 0:
                del self._tenants[request.tenant]

    def leave(self, request: Request[T]) -> None:
        """Mark a request as no longer waiting (lock held); its lane entry is skipped later."""
        request.waiting = False
        self._count(request, -1)

    def expire(self, now: float) -> None:
        """Answer every waiting request whose deadline passed (lock held)."""
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, ref = heapq.heappop(self._deadlines)
            request = ref()
            if request is None or not request.waiting:
                continue
            self.leave(request)
            rejected(self.name, "expired").inc()
            request.future.set_exception(
                InferenceTimeout(
                    f"{self.name}: request waited past its deadline "
                    f"({request.timeout_s:.3g}s) in the queue"
                )
            )
        if len(self._deadlines) > 2 * self.depth() + 64:
            self._compact()

    def _compact(self) -> None:
        """Drop the entries of requests that left early (lock held): bounded memory."""
        self._deadlines = [e for e in self._deadlines if _waiting(e[2])]
        heapq.heapify(self._deadlines)
        for priority, lane in list(self._lanes.items()):
            for tenant, fifo in list(lane.items()):
                kept = deque(r for r in fifo if r.waiting)
                if kept:
                    lane[tenant] = kept  # same key: its turn is kept
                else:
                    del lane[tenant]
            if not lane:
                del self._lanes[priority]

    def _head(self, fifo: deque[Request[T]]) -> Request[T] | None:
        while fifo and not fifo[0].waiting:
            fifo.popleft()
        return fifo[0] if fifo else None

    def oldest(self) -> Request[T] | None:
        fifos = (fifo for lane in self._lanes.values() for fifo in lane.values())
        heads = [h for h in map(self._head, fifos) if h is not None]
        return min(heads, key=lambda r: r.seq, default=None)

    def pop_batch(self, cap: int) -> list[Request[T]]:
        """The `cap` most urgent waiting requests, tenants taking turns within a priority,
        each named tenant at most `max_batch_per_tenant` of them (lock held): a batch runs
        as long as its slowest image, so one tenant's heavy images must not fill the batch
        another tenant's request rides in."""
        share = self.settings.max_batch_per_tenant
        taken: collections.Counter[str] = collections.Counter()
        batch: list[Request[T]] = []
        for priority in sorted(self._lanes, reverse=True):
            lane = self._lanes[priority]
            served: dict[str, deque[Request[T]]] = {}  # had their share of this batch
            while len(batch) < cap and lane:
                tenant, fifo = next(iter(lane.items()))
                del lane[tenant]
                request = self._head(fifo)
                if request is None:
                    continue
                fifo.popleft()
                self.leave(request)
                batch.append(request)
                taken[tenant] += 1
                if not fifo:
                    continue
                if request.tenant is not None and share is not None and taken[tenant] >= share:
                    served[tenant] = fifo
                else:
                    lane[tenant] = fifo  # to the back of the turn order
            lane.update(served)  # at the back of the turn order, for the next batch
            if not lane:
                del self._lanes[priority]
            if len(batch) == cap:
                break
        return batch


def _waiting(ref: weakref.ref[Request[Any]]) -> bool:
    request = ref()
    return request is not None and request.waiting
