"""One Triton-style scheduler per model: priority, a queue bound, one deadline per request
and dynamic batching. Written by hand because it is the product.

- Priority: higher runs first; within one priority, tenants (at the cloud, devices) take
  turns, one request each, and each tenant's requests run in arrival order: one tenant's
  flood delays another's request by one request per tenant, not by the whole flood.
- Queue bound: with `max_queue` requests waiting, a newcomer is refused with `Overloaded`,
  unless it outranks the lowest-priority request waiting: that one (the newest of the
  tenant holding most at that priority) is refused instead, so a flood of low-priority work
  never locks out urgent work. A batch holds at most `max_batch_per_tenant` requests of
  one tenant. A tenant with `max_queue_per_tenant` requests waiting has
  its next one refused, so one tenant cannot fill the queue for the others.
- Deadline: a request whose deadline passes while it waits is dropped before it reaches
  the model and answered with `InferenceTimeout`; its caller, who waits on the same
  deadline, is freed even if the model hangs on an earlier batch.
- Batching: a batch leaves when `preferred_batch_size` requests wait or the oldest has
  waited `max_delay_ms`, and takes the highest-priority requests.

Callers hold a `Pending`: `.result()` from a thread, `await pending` from asyncio. Both wait
at most until the request's own deadline, so nobody wraps a call in a pool or a timeout of
their own.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import heapq
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from edgefleet.shared.errors import EdgefleetError, InferenceTimeout, Overloaded
from edgefleet.shared.executor.deadline import batch_deadline
from edgefleet.shared.executor.metrics import BATCH_SIZE, QUEUE_DEPTH, REJECTED
from edgefleet.shared.executor.settings import BatcherSettings

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class BatcherClosed(EdgefleetError):
    code = "batcher_closed"
    http_status = 503
    hint = "the model is shutting down; retry against another instance"


@functools.cache
def _depth(batcher: str, priority: int) -> Any:
    """The queue-depth gauge child of one (model, priority)."""
    return QUEUE_DEPTH.labels(batcher, str(priority))


@functools.cache
def _rejected(batcher: str, reason: str) -> Any:
    return REJECTED.labels(batcher, reason)


@dataclass(eq=False)
class _Request(Generic[T]):
    item: T
    future: Future
    priority: int
    seq: int
    enqueued: float
    deadline: float
    timeout_s: float
    tenant: str | None = None  # who it is for (a device); None: shares one turn, no quota
    waiting: bool = True  # False once taken, expired, shed or failed


class Pending(Generic[R]):
    """The answer to one queued request, bounded by the request's deadline."""

    def __init__(self, request: _Request[Any], batcher: DynamicBatcher[Any, R]) -> None:
        self._request = request
        self._batcher = batcher

    def result(self) -> R:
        """Wait from a thread; `InferenceTimeout` once the deadline passes."""
        remaining = self._request.deadline - self._batcher.clock()
        try:
            return self._request.future.result(timeout=max(0.0, remaining))
        except (FutureTimeout, TimeoutError):  # distinct types before Python 3.11
            raise self._batcher.give_up(self._request) from None

    def __await__(self) -> Generator[Any, None, R]:
        return self._wait().__await__()

    async def _wait(self) -> R:
        """Await from asyncio without blocking the loop; the same deadline."""
        waiter = asyncio.wrap_future(self._request.future)
        remaining = self._request.deadline - self._batcher.clock()
        try:
            done, _ = await asyncio.wait({waiter}, timeout=max(0.0, remaining))
        except asyncio.CancelledError:  # the caller went away: drop it if still queued
            self._batcher.give_up(self._request, cancelled=True)
            waiter.cancel()
            raise
        if not done:
            error = self._batcher.give_up(self._request)
            waiter.cancel()
            raise error
        return waiter.result()


class DynamicBatcher(Generic[T, R]):
    """Groups single requests into batches for `run_batch(items) -> results` (same order).

    `max_batch` (optional) is asked before each batch for the current cap, so the memory
    budget can shrink batches when memory is tight. `clock` is injectable for tests.
    """

    def __init__(
        self,
        run_batch: Callable[[list[T]], Sequence[R]],
        settings: BatcherSettings | None = None,
        *,
        name: str = "model",
        max_batch: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or BatcherSettings()
        self.name = name
        self.clock = clock
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._seq = itertools.count()
        # per priority, one FIFO per tenant in turn order (a tenant served goes to the back);
        # entries that left early stay until skipped
        self._lanes: dict[int, dict[str, deque[_Request[T]]]] = {}
        self._counts: dict[int, int] = {}  # requests waiting, per priority
        self._tenants: collections.Counter[str] = collections.Counter()  # waiting, per tenant
        # heap; stale entries too. Weak: an answered request (and its input, e.g. decoded
        # pixels) is freed when its caller is done, not when its deadline comes round.
        self._deadlines: list[tuple[float, int, weakref.ref[_Request[T]]]] = []
        self._cond = threading.Condition()
        self._closed = False
        self._inflight = 0  # batches being run now
        self.batches_run = 0
        self.batch_sizes: deque[int] = deque(maxlen=1024)
        self._workers = [
            threading.Thread(target=self._loop, name=f"batcher-{name}-{i}", daemon=True)
            for i in range(self.settings.workers)
        ]
        for worker in self._workers:
            worker.start()

    # --- submitting -----------------------------------------------------------------------

    def submit(
        self,
        item: T,
        *,
        priority: int = 0,
        timeout_s: float | None = None,
        tenant: str | None = None,
    ) -> Pending[R]:
        """Queue one request; its `Pending` resolves to the result or a typed error.

        Raises `Overloaded` when the queue is full of work at least as urgent or the
        tenant's share is full, and `BatcherClosed` after `close`.
        """
        now = self.clock()
        timeout = self.settings.timeout_s if timeout_s is None else timeout_s
        request: _Request[T] = _Request(
            item, Future(), priority, next(self._seq), now, now + timeout, timeout, tenant
        )
        with self._cond:
            if self._closed:
                raise BatcherClosed(f"batcher {self.name} is closed")
            if self.depth_locked() >= self.settings.max_queue or self._over_share(tenant):
                self._expire(now)  # only live requests count against the bounds
            if self._over_share(tenant):
                _rejected(self.name, "tenant_share").inc()
                raise Overloaded(
                    f"{self.name}: {tenant} already has {self._tenants[tenant or '']} requests "
                    f"waiting (max_queue_per_tenant={self.settings.max_queue_per_tenant})",
                    retry_after_s=self._retry_after_s(),
                )
            if self.depth_locked() >= self.settings.max_queue:
                self._shed_for(request)
            lane = self._lanes.setdefault(priority, {})
            lane.setdefault(tenant or "", deque()).append(request)
            self._count(request, +1)
            heapq.heappush(self._deadlines, (request.deadline, request.seq, weakref.ref(request)))
            self._cond.notify()
        return Pending(request, self)

    def __call__(
        self,
        item: T,
        *,
        priority: int = 0,
        timeout_s: float | None = None,
        tenant: str | None = None,
    ) -> R:
        """Submit and wait (from a thread); raises InferenceTimeout past the deadline."""
        return self.submit(item, priority=priority, timeout_s=timeout_s, tenant=tenant).result()

    async def submit_async(
        self,
        item: T,
        *,
        priority: int = 0,
        timeout_s: float | None = None,
        tenant: str | None = None,
    ) -> R:
        """Submit from asyncio and await the result without blocking the event loop."""
        return await self.submit(item, priority=priority, timeout_s=timeout_s, tenant=tenant)

    def _over_share(self, tenant: str | None) -> bool:
        """Whether a named tenant already has its share of the queue waiting (lock held)."""
        share = self.settings.max_queue_per_tenant
        return tenant is not None and share is not None and self._tenants[tenant] >= share

    def _retry_after_s(self) -> float:
        return max(0.05, self.settings.max_delay_ms / 1000 * 2)

    def _shed_for(self, newcomer: _Request[T]) -> None:
        """Make room for `newcomer` in a full queue, or refuse it (lock held)."""
        retry = self._retry_after_s()
        lowest = min(p for p, n in self._counts.items() if n > 0)
        if lowest >= newcomer.priority:
            _rejected(self.name, "overloaded").inc()
            raise Overloaded(
                f"{self.name}: {self.depth_locked()} requests already waiting "
                f"(max_queue={self.settings.max_queue})",
                retry_after_s=retry,
            )
        # the newest request of the tenant that holds most at that priority
        fifo = max(self._lanes[lowest].values(), key=lambda q: sum(r.waiting for r in q))
        while not fifo[-1].waiting:
            fifo.pop()
        victim = fifo.pop()
        self._leave(victim)
        _rejected(self.name, "shed").inc()
        victim.future.set_exception(
            Overloaded(
                f"{self.name}: queue full; priority {victim.priority} gave way to "
                f"priority {newcomer.priority}",
                retry_after_s=retry,
            )
        )

    def give_up(self, request: _Request[Any], *, cancelled: bool = False) -> InferenceTimeout:
        """The caller's deadline passed (or the caller went away): drop the request if it
        still waits; the error to raise."""
        with self._cond:  # queued futures change state only under the lock
            if request.waiting:
                self._leave(request)
                request.future.cancel()
                # never reached the model
                _rejected(self.name, "cancelled" if cancelled else "expired").inc()
            elif not request.future.done() and not cancelled:
                _rejected(self.name, "timeout").inc()  # it runs past its deadline
        return InferenceTimeout(f"{self.name}: no result within {request.timeout_s:.3g}s")

    @property
    def depth(self) -> int:
        with self._cond:
            return self.depth_locked()

    def depth_locked(self) -> int:
        return sum(self._counts.values())

    def _count(self, request: _Request[T], delta: int) -> None:
        count = self._counts.get(request.priority, 0) + delta
        self._counts[request.priority] = count
        _depth(self.name, request.priority).set(count)
        if request.tenant is not None:
            self._tenants[request.tenant] += delta
            if self._tenants[request.tenant] <= 0:
                del self._tenants[request.tenant]

    def _leave(self, request: _Request[T]) -> None:
        """Mark a request as no longer waiting (lock held); its lane entry is skipped later."""
        request.waiting = False
        self._count(request, -1)

    # --- the worker -----------------------------------------------------------------------

    def max_batch_now(self) -> int:
        """The batch cap right now: max_batch_size, lowered by the memory budget."""
        cap = self.settings.max_batch_size
        if self._max_batch is not None:
            cap = max(1, min(cap, int(self._max_batch())))
        return cap

    def _expire(self, now: float) -> None:
        """Answer every waiting request whose deadline passed (lock held)."""
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, ref = heapq.heappop(self._deadlines)
            request = ref()
            if request is None or not request.waiting:
                continue
            self._leave(request)
            _rejected(self.name, "expired").inc()
            request.future.set_exception(
                InferenceTimeout(
                    f"{self.name}: request waited past its deadline "
                    f"({request.timeout_s:.3g}s) in the queue"
                )
            )
        if len(self._deadlines) > 2 * self.depth_locked() + 64:
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

    def _head(self, fifo: deque[_Request[T]]) -> _Request[T] | None:
        while fifo and not fifo[0].waiting:
            fifo.popleft()
        return fifo[0] if fifo else None

    def _oldest(self) -> _Request[T] | None:
        fifos = (fifo for lane in self._lanes.values() for fifo in lane.values())
        heads = [h for h in map(self._head, fifos) if h is not None]
        return min(heads, key=lambda r: r.seq, default=None)

    def _pop_batch(self, cap: int) -> list[_Request[T]]:
        """The `cap` most urgent waiting requests, tenants taking turns within a priority,
        each named tenant at most `max_batch_per_tenant` of them (lock held): a batch runs
        as long as its slowest image, so one tenant's heavy images must not fill the batch
        another tenant's request rides in."""
        share = self.settings.max_batch_per_tenant
        taken: collections.Counter[str] = collections.Counter()
        batch: list[_Request[T]] = []
        for priority in sorted(self._lanes, reverse=True):
            lane = self._lanes[priority]
            served: dict[str, deque[_Request[T]]] = {}  # had their share of this batch
            while len(batch) < cap and lane:
                tenant, fifo = next(iter(lane.items()))
                del lane[tenant]
                request = self._head(fifo)
                if request is None:
                    continue
                fifo.popleft()
                self._leave(request)
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

    def _take(self) -> list[_Request[T]] | None:
        """Wait for a batch: preferred size reached, oldest past max_delay, or closing."""
        delay = self.settings.max_delay_ms / 1000.0
        with self._cond:
            while True:
                now = self.clock()
                self._expire(now)
                oldest = self._oldest()
                if self._closed and oldest is None:
                    return None
                if oldest is None:
                    self._cond.wait(timeout=0.5)
                    continue
                cap = self.max_batch_now()
                preferred = min(self.settings.preferred_batch_size, cap)
                idle = self.settings.eager and self._inflight < len(self._workers)
                full = self.depth_locked() >= preferred
                if full or idle or now - oldest.enqueued >= delay or self._closed:
                    self._inflight += 1
                    return self._pop_batch(cap)
                wait = min(oldest.enqueued + delay, self._deadlines[0][0]) - now
                self._cond.wait(timeout=max(wait, 0.0005))

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            self._run_taken(batch)
            del batch  # not kept while this worker waits for the next one

    def _run_taken(self, batch: list[_Request[T]]) -> None:
        try:
            live = [r for r in batch if r.future.set_running_or_notify_cancel()]
            if live:
                BATCH_SIZE.labels(self.name).observe(len(live))
                self.batches_run += 1
                self.batch_sizes.append(len(live))
                self._run(live)
        finally:
            with self._cond:
                self._inflight -= 1
                self._cond.notify_all()

    def _run(self, live: list[_Request[T]]) -> None:
        """Run one batch; if it fails, run its requests one by one so that one poisoned
        input fails only its own caller."""
        try:
            with batch_deadline(max(r.deadline for r in live), self.clock):
                results = list(self._run_batch([r.item for r in live]))
            if len(results) != len(live):
                raise EdgefleetError(
                    f"{self.name}: batch of {len(live)} returned {len(results)} results"
                )
        except Exception as exc:
            if len(live) > 1:
                log.warning(
                    "batch failed; retrying its requests one by one",
                    extra={"batcher": self.name, "size": len(live), "error": repr(exc)},
                )
                for req in live:
                    self._run([req])
                return
            _rejected(self.name, "error").inc()
            live[0].future.set_exception(exc)
            return
        except BaseException as exc:  # KeyboardInterrupt/SystemExit: callers hear, then stop
            for req in live:
                req.future.set_exception(exc)
            raise
        for req, result in zip(live, results, strict=True):
            req.future.set_result(result)

    def close(self, *, drain: bool = True, timeout_s: float = 30.0) -> None:
        """Stop accepting work; with drain, finish what is queued, else fail it."""
        with self._cond:
            self._closed = True
            if not drain:
                for lane in self._lanes.values():
                    for request in (r for fifo in lane.values() for r in fifo):
                        if request.waiting:
                            self._leave(request)
                            request.future.set_exception(
                                BatcherClosed(f"batcher {self.name} closed")
                            )
                self._lanes.clear()
            self._cond.notify_all()
        for worker in self._workers:
            if worker is not threading.current_thread():
                worker.join(timeout=timeout_s)

    def __enter__(self) -> DynamicBatcher[T, R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _waiting(ref: weakref.ref[_Request[Any]]) -> bool:
    request = ref()
    return request is not None and request.waiting
