"""DynamicBatcher: batching, routing, overload, timeouts, errors, asyncio."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from edgefleet.shared.errors import InferenceTimeout, Overloaded
from edgefleet.shared.executor.batcher import BatcherClosed, DynamicBatcher
from edgefleet.shared.executor.settings import BatcherSettings


def wait_until(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


class Recorder:
    """run_batch that records each batch and can be held at a gate."""

    def __init__(self, hold: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()
        self.entered = threading.Event()
        if not hold:
            self.gate.set()

    def __call__(self, items: list[int]) -> list[int]:
        self.entered.set()
        assert self.gate.wait(30)
        self.batches.append(list(items))
        return [x * 10 for x in items]


def test_full_batches_leave_at_preferred_size_and_results_route_back():
    # given a batcher that would wait 30 s for a batch to fill
    run = Recorder()
    settings = BatcherSettings(preferred_batch_size=4, max_batch_size=4, max_delay_ms=10_000)
    with DynamicBatcher(run, settings, name="t-full") as batcher:
        # when 8 requests arrive
        futures = [batcher.submit(i) for i in range(8)]
        # then they run as two batches of 4 and every caller gets its own result
        assert [f.result(timeout=30) for f in futures] == [i * 10 for i in range(8)]
    assert [len(b) for b in run.batches] == [4, 4]
    assert sorted(x for b in run.batches for x in b) == list(range(8))


def test_a_lone_request_leaves_after_max_delay():
    run = Recorder()
    settings = BatcherSettings(preferred_batch_size=8, max_batch_size=8, max_delay_ms=20)
    with DynamicBatcher(run, settings, name="t-delay") as batcher:
        assert batcher(7) == 70
    assert run.batches == [[7]]


def test_threads_are_batched_together():
    run = Recorder(hold=True)
    settings = BatcherSettings(preferred_batch_size=4, max_batch_size=8, max_delay_ms=10_000)
    with DynamicBatcher(run, settings, name="t-threads") as batcher:
        results: dict[int, int] = {}
        threads = [
            threading.Thread(target=lambda i=i: results.__setitem__(i, batcher(i)))
            for i in range(4)
        ]
        for t in threads:
            t.start()
        run.gate.set()
        for t in threads:
            t.join(30)
    assert results == {i: i * 10 for i in range(4)}
    assert [len(b) for b in run.batches] == [4]


def test_full_queue_refuses_with_overloaded_and_loses_nothing_accepted():
    # given a worker stuck on the first request and a queue of 2
    run = Recorder(hold=True)
    settings = BatcherSettings(
        preferred_batch_size=1, max_batch_size=1, max_delay_ms=0, max_queue=2
    )
    batcher = DynamicBatcher(run, settings, name="t-overload")
    first = batcher.submit(0)
    assert run.entered.wait(30)
    queued = [batcher.submit(1), batcher.submit(2)]
    # when one more arrives, then it is refused with a retryable error
    with pytest.raises(Overloaded) as err:
        batcher.submit(3)
    assert err.value.retry_after_s > 0
    assert err.value.code == "overloaded"
    # and everything accepted still completes
    run.gate.set()
    assert [f.result(30) for f in [first, *queued]] == [0, 10, 20]
    batcher.close()


def test_request_times_out_while_the_worker_is_busy():
    run = Recorder(hold=True)
    settings = BatcherSettings(preferred_batch_size=1, max_batch_size=1, max_delay_ms=0)
    now = [0.0]  # the batcher's clock, moved by the test
    batcher = DynamicBatcher(run, settings, name="t-timeout", clock=lambda: now[0])
    blocker = batcher.submit(0)
    assert run.entered.wait(30)
    # the caller gives up after its timeout with a typed error
    with pytest.raises(InferenceTimeout):
        batcher(1, timeout_s=0.05)
    # a queued request whose deadline passes fails with InferenceTimeout, not a hang
    expired = batcher.submit(2, timeout_s=0.01)
    now[0] += 1.0  # its deadline passes while the worker is still busy
    run.gate.set()
    assert blocker.result(30) == 0
    with pytest.raises(InferenceTimeout):
        expired.result(30)
    batcher.close()
    assert 1 not in [x for b in run.batches for x in b]


def test_batch_errors_reach_every_caller():
    def boom(items):
        raise ValueError("model exploded")

    settings = BatcherSettings(preferred_batch_size=2, max_batch_size=2, max_delay_ms=10_000)
    with DynamicBatcher(boom, settings, name="t-error") as batcher:
        futures = [batcher.submit(i) for i in range(2)]
        for f in futures:
            with pytest.raises(ValueError, match="exploded"):
                f.result(30)


def test_one_poisoned_request_fails_alone():
    calls: list[list[int]] = []

    def picky(items):
        calls.append(list(items))
        if 13 in items:
            raise ValueError("cannot handle 13")
        return [x * 10 for x in items]

    settings = BatcherSettings(preferred_batch_size=3, max_batch_size=3, max_delay_ms=10_000)
    with DynamicBatcher(picky, settings, name="t-poison") as batcher:
        futures = [batcher.submit(x) for x in (1, 13, 2)]
        assert futures[0].result(30) == 10 and futures[2].result(30) == 20
        with pytest.raises(ValueError, match="13"):
            futures[1].result(30)
    # the batch failed once, then each request ran alone
    assert calls == [[1, 13, 2], [1], [13], [2]]


def test_wrong_result_count_is_an_error_not_a_misroute():
    settings = BatcherSettings(preferred_batch_size=2, max_batch_size=2, max_delay_ms=10_000)
    with DynamicBatcher(lambda items: [1], settings, name="t-count") as batcher:
        futures = [batcher.submit(i) for i in range(2)]
        # the batch of 2 gives 1 result: retried alone, each gets its own answer
        assert [f.result(30) for f in futures] == [1, 1]
    alone = BatcherSettings(preferred_batch_size=1, max_batch_size=1)
    with (
        DynamicBatcher(lambda items: [], alone, name="t-count0") as batcher,
        pytest.raises(Exception, match="returned 0 results"),
    ):
        batcher(1)


def test_memory_cap_shrinks_batches():
    run = Recorder(hold=True)
    settings = BatcherSettings(preferred_batch_size=8, max_batch_size=8, max_delay_ms=10_000)
    with DynamicBatcher(run, settings, name="t-cap", max_batch=lambda: 2) as batcher:
        futures = [batcher.submit(i) for i in range(6)]
        run.gate.set()
        assert [f.result(30) for f in futures] == [i * 10 for i in range(6)]
    assert max(len(b) for b in run.batches) <= 2


def test_asyncio_callers_are_batched_and_answered():
    run = Recorder()
    settings = BatcherSettings(preferred_batch_size=3, max_batch_size=3, max_delay_ms=10_000)

    async def main(batcher):
        return await asyncio.gather(*(batcher.submit_async(i) for i in range(6)))

    with DynamicBatcher(run, settings, name="t-async") as batcher:
        assert asyncio.run(main(batcher)) == [i * 10 for i in range(6)]
    assert [len(b) for b in run.batches] == [3, 3]


def test_asyncio_timeout_is_typed():
    run = Recorder(hold=True)
    settings = BatcherSettings(preferred_batch_size=1, max_batch_size=1, max_delay_ms=0)
    batcher = DynamicBatcher(run, settings, name="t-async-timeout")
    batcher.submit(0)
    assert run.entered.wait(30)

    async def main():
        await batcher.submit_async(1, timeout_s=0.05)

    with pytest.raises(InferenceTimeout):
        asyncio.run(main())
    run.gate.set()
    batcher.close()


def test_closed_batcher_refuses_and_drains():
    run = Recorder()
    batcher = DynamicBatcher(run, BatcherSettings(max_delay_ms=10_000), name="t-close")
    pending = batcher.submit(5)
    batcher.close()  # drain: the queued request still runs
    assert pending.result(30) == 50
    with pytest.raises(BatcherClosed):
        batcher.submit(6)


def test_eager_dispatches_at_once_and_batches_what_waits_while_busy():
    # given an eager batcher that would otherwise wait 10 s for 4 requests
    run = Recorder(hold=True)
    settings = BatcherSettings(
        preferred_batch_size=4, max_batch_size=8, max_delay_ms=10_000, eager=True
    )
    with DynamicBatcher(run, settings, name="t-eager") as batcher:
        # a lone request runs at once (no max_delay wait)
        first = batcher.submit(0)
        assert run.entered.wait(30)
        # requests arriving while the worker is busy form the next batch
        rest = [batcher.submit(i) for i in (1, 2, 3)]
        run.gate.set()
        assert [f.result(30) for f in [first, *rest]] == [0, 10, 20, 30]
    assert run.batches == [[0], [1, 2, 3]]
