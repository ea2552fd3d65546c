"""DynamicBatcher: batching, routing, overload, timeouts, errors, asyncio."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

import numpy as np
import pytest
from prometheus_client import REGISTRY

from edgefleet.shared.errors import InferenceTimeout, Overloaded
from edgefleet.shared.executor.batcher import BatcherClosed, DynamicBatcher
from edgefleet.shared.executor.settings import BatcherSettings
from tests.support.clock import FakeClock


def rejected(batcher: str, reason: str) -> float:
    labels = {"batcher": batcher, "reason": reason}
    return REGISTRY.get_sample_value("ef_batcher_rejected_total", labels) or 0.0


def depth(batcher: str, priority: int) -> float | None:
    labels = {"batcher": batcher, "priority": str(priority)}
    return REGISTRY.get_sample_value("ef_batcher_queue_depth", labels)


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
        assert [f.result() for f in futures] == [i * 10 for i in range(8)]
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
    batcher = DynamicBatcher(run, settings, name="t-overload").start()
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
    assert [f.result() for f in [first, *queued]] == [0, 10, 20]
    batcher.close()


def test_the_caller_is_freed_at_its_deadline_while_the_model_hangs():
    # given a worker stuck inside the model on the first request
    run = Recorder(hold=True)
    settings = BatcherSettings(preferred_batch_size=1, max_batch_size=1, max_delay_ms=0)
    batcher = DynamicBatcher(run, settings, name="t-timeout").start()
    running = batcher.submit(0, timeout_s=0.05)
    assert run.entered.wait(30)
    before = rejected("t-timeout", "timeout"), rejected("t-timeout", "expired")
    # when the deadlines pass, then both callers get the typed error, one per reason
    with pytest.raises(InferenceTimeout):
        running.result()  # it reached the model, which hangs
    with pytest.raises(InferenceTimeout):
        batcher(1, timeout_s=0.05)  # it waited in the queue: dropped, never run
    assert (rejected("t-timeout", "timeout"), rejected("t-timeout", "expired")) == (
        before[0] + 1,
        before[1] + 1,
    )
    run.gate.set()
    batcher.close()
    assert run.batches == [[0]]


def test_a_request_past_its_deadline_is_dropped_before_the_model():
    # given a worker held on a first request and a clock the test moves
    clock = FakeClock()
    run = Recorder(hold=True)
    settings = BatcherSettings(preferred_batch_size=1, max_batch_size=1, max_delay_ms=0)
    batcher = DynamicBatcher(run, settings, name="t-expire", clock=clock).start()
    blocker = batcher.submit(0)
    assert run.entered.wait(30)
    late = batcher.submit(1, timeout_s=5)
    fresh = batcher.submit(2, timeout_s=60)
    before = rejected("t-expire", "expired")
    # when 10 s pass before the worker is free
    clock.now += 10
    run.gate.set()
    # then the late request is answered with the timeout error and never reaches the model
    assert blocker.result() == 0 and fresh.result() == 20
    with pytest.raises(InferenceTimeout):
        late.result()
    batcher.close()
    assert run.batches == [[0], [2]]
    assert rejected("t-expire", "expired") == before + 1


def test_batch_errors_reach_every_caller():
    def boom(items):
        raise ValueError("model exploded")

    settings = BatcherSettings(preferred_batch_size=2, max_batch_size=2, max_delay_ms=10_000)
    with DynamicBatcher(boom, settings, name="t-error") as batcher:
        futures = [batcher.submit(i) for i in range(2)]
        for f in futures:
            with pytest.raises(ValueError, match="exploded"):
                f.result()


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
        assert futures[0].result() == 10 and futures[2].result() == 20
        with pytest.raises(ValueError, match="13"):
            futures[1].result()
    # the batch failed once, then each request ran alone
    assert calls == [[1, 13, 2], [1], [13], [2]]


def test_wrong_result_count_is_an_error_not_a_misroute():
    settings = BatcherSettings(preferred_batch_size=2, max_batch_size=2, max_delay_ms=10_000)
    with DynamicBatcher(lambda items: [1], settings, name="t-count") as batcher:
        futures = [batcher.submit(i) for i in range(2)]
        # the batch of 2 gives 1 result: retried alone, each gets its own answer
        assert [f.result() for f in futures] == [1, 1]
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
        assert [f.result() for f in futures] == [i * 10 for i in range(6)]
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
    batcher = DynamicBatcher(run, settings, name="t-async-timeout").start()
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
    batcher = DynamicBatcher(run, BatcherSettings(max_delay_ms=10_000), name="t-close").start()
    pending = batcher.submit(5)
    batcher.close()  # drain: the queued request still runs
    assert pending.result() == 50
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
        assert [f.result() for f in [first, *rest]] == [0, 10, 20, 30]
    assert run.batches == [[0], [1, 2, 3]]


def test_higher_priority_runs_first_and_arrival_order_within_one():
    # given a worker held on a first request
    run = Recorder(hold=True)
    settings = BatcherSettings(preferred_batch_size=1, max_batch_size=1, max_delay_ms=0)
    with DynamicBatcher(run, settings, name="t-priority") as batcher:
        first = batcher.submit(0)
        assert run.entered.wait(30)
        # when requests of mixed priorities queue behind it
        rest = [batcher.submit(i, priority=p) for i, p in [(1, 0), (2, 5), (3, -1), (4, 5), (5, 0)]]
        # then the queue depth is kept per priority
        assert (depth("t-priority", 5), depth("t-priority", 0), depth("t-priority", -1)) == (
            2,
            2,
            1,
        )
        run.gate.set()
        assert [p.result() for p in [first, *rest]] == [0, 10, 20, 30, 40, 50]
    # and they ran by priority, then arrival
    assert run.batches == [[0], [2], [4], [1], [5], [3]]
    assert depth("t-priority", 5) == 0


def test_a_batch_takes_the_most_urgent_requests():
    run = Recorder(hold=True)
    settings = BatcherSettings(preferred_batch_size=2, max_batch_size=2, max_delay_ms=10_000)
    with DynamicBatcher(run, settings, name="t-urgent", clock=FakeClock()) as batcher:
        first = batcher.submit(0, priority=0)
        second = batcher.submit(1, priority=0)
        assert run.entered.wait(30)
        rest = [batcher.submit(i, priority=p) for i, p in [(2, 0), (3, 9), (4, 1), (5, 9)]]
        run.gate.set()
        assert [p.result() for p in [first, second, *rest]] == [0, 10, 20, 30, 40, 50]
    assert run.batches == [[0, 1], [3, 5], [4, 2]]


def test_a_full_queue_gives_way_only_to_a_higher_priority():
    # given a held worker and a queue of 2 filled at priority 0
    run = Recorder(hold=True)
    settings = BatcherSettings(
        preferred_batch_size=1, max_batch_size=1, max_delay_ms=0, max_queue=2
    )
    batcher = DynamicBatcher(run, settings, name="t-shed").start()
    first = batcher.submit(0)
    assert run.entered.wait(30)
    older, newer = batcher.submit(1), batcher.submit(2)
    # when one more of the same priority arrives, then it is refused
    with pytest.raises(Overloaded):
        batcher.submit(3)
    # when an urgent one arrives, then the newest low-priority request gives way to it
    urgent = batcher.submit(4, priority=5)
    with pytest.raises(Overloaded, match="gave way"):
        newer.result()
    assert rejected("t-shed", "shed") == 1 and rejected("t-shed", "overloaded") == 1
    run.gate.set()
    assert [first.result(), urgent.result(), older.result()] == [0, 40, 10]
    batcher.close()
    assert run.batches == [[0], [4], [1]]


def test_pending_is_awaited_from_asyncio_with_its_priority():
    run = Recorder(hold=True)
    settings = BatcherSettings(preferred_batch_size=1, max_batch_size=1, max_delay_ms=0)
    with DynamicBatcher(run, settings, name="t-await") as batcher:
        first = batcher.submit(0)
        assert run.entered.wait(30)
        low, high = batcher.submit(1, priority=-3), batcher.submit(2, priority=3)

        async def main():
            run.gate.set()
            return await asyncio.gather(low, high)

        assert asyncio.run(main()) == [10, 20] and first.result() == 0
    assert run.batches == [[0], [2], [1]]


def test_an_awaiting_caller_that_goes_away_drops_its_queued_request():
    run = Recorder(hold=True)
    settings = BatcherSettings(preferred_batch_size=1, max_batch_size=1, max_delay_ms=0)
    batcher = DynamicBatcher(run, settings, name="t-cancel").start()
    first = batcher.submit(0)
    assert run.entered.wait(30)

    async def main():
        task = asyncio.ensure_future(batcher.submit_async(1))
        await asyncio.sleep(0)  # one loop turn: the task has queued its request and waits
        assert batcher.depth == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    # the request left the queue and is counted as cancelled, not as a timeout
    assert batcher.depth == 0 and rejected("t-cancel", "cancelled") == 1
    run.gate.set()
    assert first.result() == 0
    batcher.close()
    assert run.batches == [[0]]


def test_requests_past_their_deadline_do_not_hold_places_in_a_full_queue():
    # given a held worker and a queue of 1 taken by a request whose deadline has passed
    clock = FakeClock()
    run = Recorder(hold=True)
    settings = BatcherSettings(
        preferred_batch_size=1, max_batch_size=1, max_delay_ms=0, max_queue=1
    )
    batcher = DynamicBatcher(run, settings, name="t-bound-live", clock=clock).start()
    first = batcher.submit(0)
    assert run.entered.wait(30)
    stale = batcher.submit(1, timeout_s=5)
    clock.now += 10
    # when another request of the same priority arrives, then it takes the expired one's place
    fresh = batcher.submit(2)
    with pytest.raises(InferenceTimeout):
        stale.result()
    run.gate.set()
    assert [first.result(), fresh.result()] == [0, 20]
    batcher.close()
    assert run.batches == [[0], [2]]


def test_an_answered_request_frees_its_input_before_its_deadline():
    # given a request whose deadline is far off (its input: decoded pixels, say)
    settings = BatcherSettings(preferred_batch_size=1, max_batch_size=1, max_delay_ms=1)
    with DynamicBatcher(lambda items: [0 for _ in items], settings, name="t-free") as batcher:
        pixels = np.zeros((64, 64, 3), np.uint8)
        freed = weakref.ref(pixels)
        # when it is answered and its caller lets go of it
        assert batcher.submit(pixels, timeout_s=300).result() == 0
        del pixels
        gc.collect()
        # then nothing in the batcher keeps the input alive
        assert freed() is None


def test_tenants_take_turns_within_a_priority():
    # given a worker held on a first request, and one tenant's flood queued behind it
    run = Recorder(hold=True)
    settings = BatcherSettings(preferred_batch_size=1, max_batch_size=1, max_delay_ms=0)
    with DynamicBatcher(run, settings, name="t-turns") as batcher:
        first = batcher.submit(0, tenant="cam-a")
        assert run.entered.wait(30)
        flood = [batcher.submit(i, tenant="cam-a") for i in range(1, 5)]
        # when another tenant's request arrives last, with untenanted and urgent ones
        other = batcher.submit(5, tenant="cam-b")
        untenanted = batcher.submit(6)
        urgent = batcher.submit(7, priority=5, tenant="cam-a")
        run.gate.set()
        for pending in [first, *flood, other, untenanted, urgent]:
            pending.result()
    # then priority still comes first, and within a priority each tenant has one turn
    assert run.batches == [[0], [7], [1], [5], [6], [2], [3], [4]]


def test_a_batch_fills_with_tenants_in_turn_when_their_share_is_unbounded():
    run = Recorder(hold=True)
    settings = BatcherSettings(
        preferred_batch_size=3, max_batch_size=3, max_delay_ms=10_000, max_batch_per_tenant=None
    )
    with DynamicBatcher(run, settings, name="t-turn-batch", clock=FakeClock()) as batcher:
        firsts = [batcher.submit(i, tenant="cam-a") for i in range(3)]
        assert run.entered.wait(30)
        rest = [batcher.submit(i, tenant="cam-a") for i in range(3, 6)]
        rest += [batcher.submit(i, tenant=t) for i, t in [(6, "cam-b"), (7, "cam-c")]]
        rest.append(batcher.submit(8, tenant="cam-b"))
        run.gate.set()
        for pending in [*firsts, *rest]:
            pending.result()
    assert run.batches == [[0, 1, 2], [3, 6, 7], [4, 8, 5]]


def test_a_tenant_over_its_share_is_refused_and_the_others_still_queue():
    # given a held worker and one tenant with its share (2) waiting
    run = Recorder(hold=True)
    settings = BatcherSettings(
        preferred_batch_size=1, max_batch_size=1, max_delay_ms=0, max_queue_per_tenant=2
    )
    with DynamicBatcher(run, settings, name="t-share") as batcher:
        first = batcher.submit(0, tenant="cam-a")
        assert run.entered.wait(30)
        held = [batcher.submit(i, tenant="cam-a") for i in (1, 2)]
        # when it sends one more, then that one is refused, counted, with a retry hint
        with pytest.raises(Overloaded, match="cam-a already has 2") as refused:
            batcher.submit(3, tenant="cam-a")
        assert refused.value.retry_after_s is not None
        assert rejected("t-share", "tenant_share") == 1
        # and another tenant, and untenanted work, still get in
        other = batcher.submit(4, tenant="cam-b")
        untenanted = [batcher.submit(i) for i in (5, 6, 7)]
        run.gate.set()
        answers = [p.result() for p in [first, *held, other, *untenanted]]
        assert answers == [0, 10, 20, 40, 50, 60, 70]
        # and once its requests ran, the tenant has its share again
        assert batcher.submit(8, tenant="cam-a").result() == 80


def test_a_full_queue_sheds_the_tenant_holding_most():
    run = Recorder(hold=True)
    settings = BatcherSettings(
        preferred_batch_size=1, max_batch_size=1, max_delay_ms=0, max_queue=3
    )
    with DynamicBatcher(run, settings, name="t-shed-tenant") as batcher:
        first = batcher.submit(0, tenant="cam-b")
        assert run.entered.wait(30)
        b_waits = batcher.submit(1, tenant="cam-b")
        a_old, a_new = batcher.submit(2, tenant="cam-a"), batcher.submit(3, tenant="cam-a")
        urgent = batcher.submit(4, priority=5, tenant="cam-c")
        with pytest.raises(Overloaded, match="gave way"):
            a_new.result()
        run.gate.set()
        assert [p.result() for p in [first, urgent, b_waits, a_old]] == [0, 40, 10, 20]


def test_a_batch_holds_one_request_per_tenant_by_default():
    # given a held worker, one tenant's flood and two other tenants' requests behind it
    run = Recorder(hold=True)
    settings = BatcherSettings(preferred_batch_size=1, max_batch_size=4, max_delay_ms=0)
    with DynamicBatcher(run, settings, name="t-turn-share") as batcher:
        first = batcher.submit(0, tenant="cam-a")
        assert run.entered.wait(30)
        flood = [batcher.submit(i, tenant="cam-a") for i in range(1, 4)]
        others = [batcher.submit(4, tenant="cam-b"), batcher.submit(5, tenant="cam-c")]
        untenanted = [batcher.submit(6), batcher.submit(7)]
        run.gate.set()
        for pending in [first, *flood, *others, *untenanted]:
            pending.result()
    # then each batch holds one request of each device (untenanted work is not bounded),
    # so a device's case never rides in a batch full of another's
    assert run.batches == [[0], [1, 4, 5, 6], [7, 2], [3]]


def test_a_batch_runs_under_its_latest_deadline_for_backends_to_carry():
    from edgefleet.shared.executor.deadline import current_deadline

    seen: list[float | None] = []

    def run(items: list[int]) -> list[int]:
        deadline = current_deadline()
        seen.append(deadline.remaining_s() if deadline is not None else None)
        return items

    clock = FakeClock()
    settings = BatcherSettings(preferred_batch_size=2, max_batch_size=2, max_delay_ms=10_000)
    # given two requests with 5 s and 9 s left, batched together
    with DynamicBatcher(run, settings, name="t-deadline", clock=clock) as batcher:
        first, second = batcher.submit(1, timeout_s=5), batcher.submit(2, timeout_s=9)
        assert [first.result(), second.result()] == [1, 2]
    # then the batch ran with the later one's deadline (it answers both), and outside a
    # batch there is none
    assert seen == [9.0]
    assert current_deadline() is None


def test_a_batcher_runs_nothing_until_started_and_a_closed_unstarted_one_fails_what_waits():
    # given a batcher built but not started, and a request submitted to it
    run = Recorder()
    batcher = DynamicBatcher(run, BatcherSettings(max_delay_ms=0), name="t-unstarted")
    waiting = batcher.submit(5)
    # when it is closed without ever starting
    batcher.close()
    # then nothing ran and the caller hears why instead of waiting out its deadline
    with pytest.raises(BatcherClosed):
        waiting.result()
    assert run.batches == []
    # and a started one runs what was submitted before start, once however often started
    later = DynamicBatcher(run, BatcherSettings(max_delay_ms=0), name="t-later")
    queued = later.submit(4)
    with later.start().start():
        assert queued.result() == 40
    assert run.batches == [[4]]
