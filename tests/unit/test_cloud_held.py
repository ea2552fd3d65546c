"""The cloud processor's held MQTT redeliveries and its stale sweep stay bounded: held
redeliveries by count (one thread for all), the sweep by never queueing a case twice."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

from edgefleet.bench.harness import escalation_case
from edgefleet.cloud.held import HeldRedeliveries
from edgefleet.shared.messages import CloudVerdict, utcnow
from tests.support.clock import FakeClock
from tests.support.cloud import PNG, rules_only_services
from tests.support.waiting import counter_value, eventually


def test_held_redeliveries_are_bounded_by_count_and_released_when_due() -> None:
    clock = FakeClock()
    held: HeldRedeliveries[str, str] = HeldRedeliveries(max_entries=2, clock=clock)
    full = counter_value("ef_cloud_held_full_total")
    # the gauges sum every live holder: what others (earlier tests') hold is counted apart
    entries, held_bytes = (
        counter_value("ef_cloud_held_entries"),
        counter_value("ef_cloud_held_bytes"),
    )
    # given two redeliveries held, the later one due first
    assert held.hold("a", "job-a", size=100, after_s=5)
    assert held.hold("b", "job-b", size=30, after_s=2)
    # when a third comes past the bound
    assert not held.hold("c", "job-c", size=7, after_s=1)
    # then it is refused and counted, and the gauges show what is held
    assert counter_value("ef_cloud_held_full_total") == full + 1
    assert counter_value("ef_cloud_held_entries") == entries + 2
    assert counter_value("ef_cloud_held_bytes") == held_bytes + 130
    assert held.holds("a") and held.holds("b") and not held.holds("c")
    # and each is handed back only when its time comes, earliest first
    assert held.due() == []
    clock.now += 2
    assert held.due() == ["job-b"]
    clock.now += 3
    assert held.due() == ["job-a"]
    assert len(held) == 0 and held.bytes == 0 and not held.holds("a")
    # with room again, a new one is held
    assert held.hold("c", "job-c", size=7, after_s=1)


def test_a_redelivery_past_the_bound_is_acked_without_a_verdict_not_held(
    tmp_path: Path,
) -> None:
    svc = rules_only_services(tmp_path, ingest={"held_max": 1})
    svc.processor.runner.recheck_s = 3600  # held ones stay held for the whole test
    full = counter_value("ef_cloud_held_full_total")
    entries, held_bytes = (
        counter_value("ef_cloud_held_entries"),
        counter_value("ef_cloud_held_bytes"),
    )
    try:
        # given two cases another live replica has just claimed
        first, second = escalation_case("cam-a"), escalation_case("cam-b")
        for case in (first, second):
            svc.store.ledger.claim(
                case,
                image_sha256="1" * 64,
                image=PNG,
                source="mqtt",
                replica="other",
                stale_after_s=60,
            )
        # when the broker redelivers the first here, it is held (its message not acked)
        held = svc.processor.submit(first, PNG, source="mqtt", flow_controlled=True)
        eventually(lambda: counter_value("ef_cloud_held_entries") == entries + 1, what="first held")
        assert counter_value("ef_cloud_held_bytes") == held_bytes + len(PNG)
        # and when the second comes with the bound reached
        refused = svc.processor.submit(second, PNG, source="mqtt", flow_controlled=True)
        # then it is answered without a verdict (acked), counted; the held one stays held
        assert refused.result(timeout=30) is None
        assert counter_value("ef_cloud_held_full_total") == full + 1
        assert counter_value("ef_cloud_held_entries") == entries + 1
        assert not held.done()
        # and the case is not lost: it is still claimed in the store for its owner to answer
        assert svc.store.lookup.verdict(second.case_id) is None
        pending = svc.store.ledger.stale_cases(
            replica="other", replica_started=utcnow(), stale_after_s=0
        )
        assert second.case_id in {case.case_id for case, _ in pending}
    finally:
        svc.close()


def test_the_sweep_twice_while_the_queue_is_backed_up_queues_each_case_once(
    tmp_path: Path,
) -> None:
    svc = rules_only_services(tmp_path)
    busy, release = threading.Event(), threading.Event()

    def hold_the_worker(verdict: CloudVerdict) -> None:
        busy.set()
        assert release.wait(30)

    svc.processor.answers.publish = hold_the_worker
    requeued = counter_value("ef_cloud_sweep_cases_total", outcome="requeued")
    skipped = counter_value("ef_cloud_sweep_cases_total", outcome="already_queued")
    processed = counter_value("ef_cloud_cases_total", source="sweep", outcome="processed")
    try:
        # given the only worker busy, so the queue backs up
        svc.processor.submit(escalation_case("cam-a"), PNG, source="rest")
        assert busy.wait(30)
        # and three cases a crashed replica claimed an hour ago
        cases = [escalation_case("cam-b", frame_index=i) for i in range(3)]
        for case in cases:
            svc.store.ledger.claim(
                case,
                image_sha256="2" * 64,
                image=PNG,
                source="mqtt",
                replica="crashed",
                stale_after_s=60,
            )
        svc.store.db.execute(
            "UPDATE ef_cases SET claimed_at = ? WHERE claimed_by = 'crashed'",
            (utcnow() - timedelta(hours=1),),
        )
        # when the sweep runs twice before a worker is free
        assert svc.processor.sweep() == 3
        assert svc.processor.sweep() == 0
        # then each case is queued once, and the skipped ones are counted
        assert svc.processor.depth == 3
        assert counter_value("ef_cloud_sweep_cases_total", outcome="requeued") == requeued + 3
        assert counter_value("ef_cloud_sweep_cases_total", outcome="already_queued") == skipped + 3
        # and once the worker is free each is answered, run once
        release.set()
        for case in cases:
            assert svc.processor.wait_verdict(case.case_id, timeout_s=30) is not None
        eventually(
            lambda: (
                counter_value("ef_cloud_cases_total", source="sweep", outcome="processed")
                == processed + 3
            ),
            what="three sweep cases processed",
        )
        assert svc.processor.depth == 0
    finally:
        release.set()
        svc.close()
