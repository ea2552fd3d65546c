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
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Generic, TypeVar

from edgefleet.shared.errors import EdgefleetError, InferenceTimeout, Overloaded
from edgefleet.shared.executor.deadline import batch_deadline
from edgefleet.shared.executor.lanes import Lanes, Request, rejected
from edgefleet.shared.executor.metrics import BATCH_SIZE
from edgefleet.shared.executor.settings import BatcherSettings

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class BatcherClosed(EdgefleetError):
    code = "batcher_closed"
    http_status = 503
    hint = "the model is shutting down; retry against another instance"


class Pending(Generic[R]):
    """The answer to one queued request, bounded by the request's deadline."""

    def __init__(self, request: Request[Any], batcher: DynamicBatcher[Any, R]) -> None:
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
        self._lanes: Lanes[T] = Lanes(name, self.settings)
        self._cond = threading.Condition()
        self._closed = False
        self._inflight = 0  # batches being run now
        self.batches_run = 0
        self.batch_sizes: deque[int] = deque(maxlen=1024)
        self._workers = [
            threading.Thread(target=self._loop, name=f"batcher-{name}-{i}", daemon=True)
            for i in range(self.settings.workers)
        ]

    def start(self) -> DynamicBatcher[T, R]:
        """Start the workers (once); requests submitted before wait for them."""
        with self._cond:
            idle = [w for w in self._workers if w.ident is None]
            for worker in idle:
                worker.start()
        return self

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
        request: Request[T] = Request(
            item, Future(), priority, next(self._seq), now, now + timeout, timeout, tenant
        )
        with self._cond:
            if self._closed:
                raise BatcherClosed(f"batcher {self.name} is closed")
            lanes = self._lanes
            if lanes.depth() >= self.settings.max_queue or lanes.over_share(tenant):
                lanes.expire(now)  # only live requests count against the bounds
            if lanes.over_share(tenant):
                rejected(self.name, "tenant_share").inc()
                raise Overloaded(
                    f"{self.name}: {tenant} already has {lanes.tenant_depth(tenant)} requests "
                    f"waiting (max_queue_per_tenant={self.settings.max_queue_per_tenant})",
                    retry_after_s=lanes.retry_after_s(),
                )
            if lanes.depth() >= self.settings.max_queue:
                lanes.shed_for(request)
            lanes.add(request)
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

    def give_up(self, request: Request[Any], *, cancelled: bool = False) -> InferenceTimeout:
        """The caller's deadline passed (or the caller went away): drop the request if it
        still waits; the error to raise."""
        with self._cond:  # queued futures change state only under the lock
            if request.waiting:
                self._lanes.leave(request)
                request.future.cancel()
                # never reached the model
                rejected(self.name, "cancelled" if cancelled else "expired").inc()
            elif not request.future.done() and not cancelled:
                rejected(self.name, "timeout").inc()  # it runs past its deadline
        return InferenceTimeout(f"{self.name}: no result within {request.timeout_s:.3g}s")

    @property
    def depth(self) -> int:
        with self._cond:
            return self._lanes.depth()

    # --- the worker -----------------------------------------------------------------------

    def max_batch_now(self) -> int:
        """The batch cap right now: max_batch_size, lowered by the memory budget."""
        cap = self.settings.max_batch_size
        if self._max_batch is not None:
            cap = max(1, min(cap, int(self._max_batch())))
        return cap

    def _take(self) -> list[Request[T]] | None:
        """Wait for a batch: preferred size reached, oldest past max_delay, or closing."""
        delay = self.settings.max_delay_ms / 1000.0
        with self._cond:
            while True:
                now = self.clock()
                self._lanes.expire(now)
                oldest = self._lanes.oldest()
                if self._closed and oldest is None:
                    return None
                if oldest is None:
                    self._cond.wait(timeout=0.5)
                    continue
                cap = self.max_batch_now()
                preferred = min(self.settings.preferred_batch_size, cap)
                idle = self.settings.eager and self._inflight < len(self._workers)
                full = self._lanes.depth() >= preferred
                if full or idle or now - oldest.enqueued >= delay or self._closed:
                    self._inflight += 1
                    return self._lanes.pop_batch(cap)
                wait = min(oldest.enqueued + delay, self._lanes.next_deadline()) - now
                self._cond.wait(timeout=max(wait, 0.0005))

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            self._run_taken(batch)
            del batch  # not kept while this worker waits for the next one

    def _run_taken(self, batch: list[Request[T]]) -> None:
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

    def _run(self, live: list[Request[T]]) -> None:
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
            rejected(self.name, "error").inc()
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
            started = [w for w in self._workers if w.ident is not None]
            if not drain or not started:  # never started: nothing would run what waits
                self._lanes.fail_all(lambda: BatcherClosed(f"batcher {self.name} closed"))
            self._cond.notify_all()
        for worker in started:
            if worker is not threading.current_thread():
                worker.join(timeout=timeout_s)

    def __enter__(self) -> DynamicBatcher[T, R]:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
