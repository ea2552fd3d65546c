"""Triton-style dynamic batcher, written by hand because it is the product.

Requests queue; a batch leaves when `preferred_batch_size` requests wait or the oldest has
waited `max_delay_ms`. The queue is bounded (a full queue refuses with `Overloaded`), each
request has a deadline (`InferenceTimeout` when it passes before its batch runs), and each
result goes back to its own caller through a `concurrent.futures.Future`, which threads
wait on directly and asyncio awaits through `submit_async`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from edgefleet.shared.errors import EdgefleetError, InferenceTimeout, Overloaded
from edgefleet.shared.executor.metrics import BATCH_SIZE, QUEUE_DEPTH, REJECTED
from edgefleet.shared.executor.settings import BatcherSettings

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class BatcherClosed(EdgefleetError):
    code = "batcher_closed"
    http_status = 503
    hint = "the model is shutting down; retry against another instance"


@dataclass
class _Request(Generic[T, R]):
    item: T
    future: Future
    enqueued: float
    deadline: float
    taken: bool = field(default=False)


class DynamicBatcher(Generic[T, R]):
    """Groups single requests into batches for `run_batch(items) -> results` (same order).

    `max_batch` (optional) is asked before each batch for the current cap, so the memory
    budget can shrink batches when memory is tight.
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
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._clock = clock
        self._queue: deque[_Request[T, R]] = deque()
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

    def submit(self, item: T, *, timeout_s: float | None = None) -> Future:
        """Queue one request; the Future resolves to its result or a typed error."""
        now = self._clock()
        timeout = self.settings.timeout_s if timeout_s is None else timeout_s
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise BatcherClosed(f"batcher {self.name} is closed")
            if len(self._queue) >= self.settings.max_queue:
                REJECTED.labels(self.name, "overloaded").inc()
                raise Overloaded(
                    f"{self.name}: {len(self._queue)} requests already waiting "
                    f"(max_queue={self.settings.max_queue})",
                    retry_after_s=max(0.05, self.settings.max_delay_ms / 1000 * 2),
                )
            self._queue.append(_Request(item, future, now, now + timeout))
            QUEUE_DEPTH.labels(self.name).set(len(self._queue))
            self._cond.notify()
        return future

    def __call__(self, item: T, *, timeout_s: float | None = None) -> R:
        """Submit and wait (from a thread); raises InferenceTimeout past the deadline."""
        timeout = self.settings.timeout_s if timeout_s is None else timeout_s
        future = self.submit(item, timeout_s=timeout)
        try:
            return future.result(timeout=timeout)
        except (FutureTimeout, TimeoutError):  # distinct types before Python 3.11
            future.cancel()
            REJECTED.labels(self.name, "timeout").inc()
            raise InferenceTimeout(f"{self.name}: no result within {timeout:.3g}s") from None

    async def submit_async(self, item: T, *, timeout_s: float | None = None) -> R:
        """Submit from asyncio and await the result without blocking the event loop."""
        timeout = self.settings.timeout_s if timeout_s is None else timeout_s
        future = self.submit(item, timeout_s=timeout)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            future.cancel()
            REJECTED.labels(self.name, "timeout").inc()
            raise InferenceTimeout(f"{self.name}: no result within {timeout:.3g}s") from None

    @property
    def depth(self) -> int:
        with self._cond:
            return len(self._queue)

    # --- the worker -----------------------------------------------------------------------

    def max_batch_now(self) -> int:
        """The batch cap right now: max_batch_size, lowered by the memory budget."""
        cap = self.settings.max_batch_size
        if self._max_batch is not None:
            cap = max(1, min(cap, int(self._max_batch())))
        return cap

    def _expire(self, now: float) -> None:
        """Fail queued requests whose deadline passed or whose caller gave up."""
        keep: deque[_Request[T, R]] = deque()
        for req in self._queue:
            if req.future.cancelled():
                continue
            if now >= req.deadline:
                REJECTED.labels(self.name, "timeout").inc()
                req.future.set_exception(
                    InferenceTimeout(f"{self.name}: request waited past its deadline in the queue")
                )
                continue
            keep.append(req)
        self._queue = keep

    def _take(self) -> list[_Request[T, R]] | None:
        """Wait for a batch: preferred size reached, oldest past max_delay, or closing."""
        delay = self.settings.max_delay_ms / 1000.0
        with self._cond:
            while True:
                now = self._clock()
                self._expire(now)
                if self._closed and not self._queue:
                    return None
                cap = self.max_batch_now()
                preferred = min(self.settings.preferred_batch_size, cap)
                if self._queue:
                    oldest = self._queue[0].enqueued
                    idle = self.settings.eager and self._inflight < len(self._workers)
                    full = len(self._queue) >= preferred
                    if full or idle or now - oldest >= delay or self._closed:
                        batch = [self._queue.popleft() for _ in range(min(cap, len(self._queue)))]
                        QUEUE_DEPTH.labels(self.name).set(len(self._queue))
                        self._inflight += 1
                        return batch
                    wait = min(oldest + delay - now, self._queue[0].deadline - now)
                    self._cond.wait(timeout=max(wait, 0.0005))
                else:
                    self._cond.wait(timeout=0.5)

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
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

    def _run(self, live: list[_Request[T, R]]) -> None:
        """Run one batch; if it fails, run its requests one by one so that one poisoned
        input fails only its own caller."""
        try:
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
            REJECTED.labels(self.name, "error").inc()
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
                while self._queue:
                    req = self._queue.popleft()
                    if not req.future.cancelled():
                        req.future.set_exception(BatcherClosed(f"batcher {self.name} closed"))
            self._cond.notify_all()
        for worker in self._workers:
            if worker is not threading.current_thread():
                worker.join(timeout=timeout_s)

    def __enter__(self) -> DynamicBatcher[T, R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
