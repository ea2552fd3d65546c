"""Cases that need no model are answered in batches (one transaction for their claims, one
for their verdicts) with the guarantees of one case at a time: each answered, run to a
verdict once, its copies counted; a batch that fails, or meets a store outage, loses none."""

from __future__ import annotations

import threading
from pathlib import Path

from edgefleet.bench.harness import escalation_case
from edgefleet.cloud.router import Route
from edgefleet.shared.db import StoreUnavailable
from edgefleet.shared.messages import CloudVerdict
from tests.support.cloud import PNG, rules_only_services
from tests.support.waiting import counter_value


class Gate:
    """Holds the only worker on the first verdict it publishes until `open`."""

    def __init__(self) -> None:
        self.held = threading.Event()
        self._open = threading.Event()

    def __call__(self, verdict: CloudVerdict) -> None:
        if not self.held.is_set():
            self.held.set()
            assert self._open.wait(30)

    def open(self) -> None:
        self._open.set()


def _accounts(svc) -> dict[str, dict]:
    return {row["case_id"]: row for row in svc.store.ledger.accounts()}


def _behind_a_busy_worker(svc, cases, *, source: str = "rest", while_held=None) -> list:
    """Hold the only worker on a first case, queue `cases` behind it (they are taken as
    one batch), then let it go: the verdicts of the first case and of `cases`."""
    gate = Gate()
    svc.processor.answers.publish = gate
    try:
        head = svc.processor.submit(escalation_case("cam-a"), PNG, source=source)
        assert gate.held.wait(30)
        if while_held is not None:
            while_held()
        futures = [svc.processor.submit(case, PNG, source=source) for case in cases]
        gate.open()
        return [future.result(timeout=60) for future in [head, *futures]]
    finally:
        gate.open()


def test_cases_queued_together_are_answered_in_one_batch_each_once(tmp_path: Path) -> None:
    svc = rules_only_services(tmp_path, batch_max=32)
    svc.processor.runner.recheck_s = 0.05
    gate = Gate()
    svc.processor.answers.publish = gate
    batches = counter_value("ef_cloud_case_batch_size_count")
    batched = counter_value("ef_cloud_case_batch_size_sum")
    try:
        # given the only worker busy with a first case
        first = escalation_case("cam-a")
        futures = [svc.processor.submit(first, PNG, source="mqtt", flow_controlled=True)]
        assert gate.held.wait(30)
        # and queued behind it: ten new cases, a second copy of one of them, and a copy
        # of the first (answered by the time the batch runs)
        cases = [escalation_case(f"cam-{i % 3}", frame_index=i) for i in range(10)]
        for case in [*cases, cases[4], first]:
            futures.append(svc.processor.submit(case, PNG, source="mqtt", flow_controlled=True))
        assert svc.processor.depth == 12
        # when the worker is free
        gate.open()
        verdicts = [future.result(timeout=30) for future in futures]
        # then the twelve were taken as one batch
        assert counter_value("ef_cloud_case_batch_size_count") == batches + 1
        assert counter_value("ef_cloud_case_batch_size_sum") == batched + 12
        # and every copy is answered with its case's one verdict
        assert all(isinstance(v, CloudVerdict) for v in verdicts)
        assert [v.case_id for v in verdicts] == [
            c.case_id for c in [first, *cases, cases[4], first]
        ]
        assert verdicts[11] == verdicts[5] and verdicts[12] == verdicts[0]
        # and the store's audit: each case run to a verdict once, every copy counted
        accounts = _accounts(svc)
        assert len(accounts) == 11
        assert {row["completed_runs"] for row in accounts.values()} == {1}
        assert {row["attempts"] for row in accounts.values()} == {1}
        assert all(row["answered"] for row in accounts.values())
        assert accounts[cases[4].case_id]["deliveries"] == 2
        assert accounts[first.case_id]["deliveries"] == 2
    finally:
        gate.open()
        svc.close()


def test_a_batch_that_fails_is_run_case_by_case_and_no_case_is_answered_twice(
    tmp_path: Path,
) -> None:
    svc = rules_only_services(tmp_path)
    cases = [escalation_case("cam-b", frame_index=i) for i in range(6)]
    run = svc.cascade.run
    failed = threading.Event()

    def fails_once_on_the_fourth(route, case, image, image_sha256):
        if case.case_id == cases[3].case_id and not failed.is_set():
            failed.set()
            raise RuntimeError("a bug in the cascade")
        return run(route, case, image, image_sha256)

    svc.cascade.run = fails_once_on_the_fourth  # type: ignore[method-assign]
    try:
        # given six cases queued behind a busy worker, when their batch fails midway (its
        # claims committed, no verdict stored yet)
        verdicts = _behind_a_busy_worker(svc, cases)
        assert failed.is_set()
        # then every case is still answered, each by one stored verdict
        assert all(isinstance(v, CloudVerdict) for v in verdicts), verdicts
        accounts = _accounts(svc)
        assert {accounts[c.case_id]["completed_runs"] for c in cases} == {1}
        # the batch counted a run of each, the one-by-one retry another
        assert {accounts[c.case_id]["attempts"] for c in cases} == {2}
        assert {accounts[c.case_id]["deliveries"] for c in cases} == {1}
    finally:
        svc.close()


def test_a_store_outage_while_a_batch_saves_its_verdicts_is_waited_out(tmp_path: Path) -> None:
    svc = rules_only_services(tmp_path)
    save = svc.store.ledger.save_verdict
    outages = []

    def unavailable_twice(verdict, *, replica):
        if len(outages) < 2:
            outages.append(verdict.case_id)
            raise StoreUnavailable("database is locked")
        return save(verdict, replica=replica)

    def break_the_store() -> None:
        svc.store.ledger.save_verdict = unavailable_twice  # type: ignore[method-assign]

    cases = [escalation_case("cam-c", frame_index=i) for i in range(5)]
    try:
        verdicts = _behind_a_busy_worker(svc, cases, while_held=break_the_store)
        assert len(outages) == 2
        assert all(isinstance(v, CloudVerdict) for v in verdicts)
        accounts = _accounts(svc)
        # the outage rolled the batch's verdicts back and the retry stored each once
        assert {accounts[c.case_id]["completed_runs"] for c in cases} == {1}
        assert {accounts[c.case_id]["attempts"] for c in cases} == {1}
    finally:
        svc.close()


def test_a_store_outage_while_a_batch_claims_its_cases_is_waited_out(tmp_path: Path) -> None:
    svc = rules_only_services(tmp_path)
    claim = svc.store.ledger.claim
    calls = []

    def unavailable_on_the_third(case, **kwargs):
        calls.append(case.case_id)
        if len(calls) == 4:  # the third case of the batch (the first call is the head's)
            raise StoreUnavailable("database is locked")
        return claim(case, **kwargs)

    svc.store.ledger.claim = unavailable_on_the_third  # type: ignore[method-assign]
    cases = [escalation_case("cam-d", frame_index=i) for i in range(5)]
    try:
        verdicts = _behind_a_busy_worker(svc, cases, source="mqtt")
        assert all(isinstance(v, CloudVerdict) for v in verdicts)
        # the outage rolled the batch's claims back, their deliveries with them; the
        # retry noted each arrival again: one delivery, one run, one verdict per case
        accounts = _accounts(svc)
        assert len(calls) == 1 + 2 + 1 + 5
        assert {accounts[c.case_id]["deliveries"] for c in cases} == {1}
        assert {accounts[c.case_id]["attempts"] for c in cases} == {1}
        assert {accounts[c.case_id]["completed_runs"] for c in cases} == {1}
    finally:
        svc.close()


def test_a_case_that_needs_a_model_is_never_batched(tmp_path: Path) -> None:
    svc = rules_only_services(tmp_path)
    read = Route(name="read", model="ppocr", timeout_s=5, priority=0, fallback=True)
    gate = Gate()
    svc.processor.answers.publish = gate
    processor = svc.processor
    try:
        head = processor.submit(escalation_case("cam-a"), PNG, source="rest")
        assert gate.held.wait(30)
        # given, queued in this order: two rule cases, a model case, a rule case
        jobs = [
            processor.admission.job(escalation_case("cam-r", frame_index=i), PNG, source="rest")
            for i in range(4)
        ]
        jobs[2].route = read
        for job in jobs:
            processor.queue.put(job)
        # when a worker takes the first
        batch, after = processor.runner.take(processor.queue.get_nowait())
        # then the rule cases before the model case form the batch, the model case runs
        # alone after it, and the last rule case waits for the next take
        assert batch == jobs[:2] and after is jobs[2]
        assert processor.depth == 1
        batch, after = processor.runner.take(processor.queue.get_nowait())
        assert batch == [jobs[3]] and after is None
        # and a model case taken first is taken alone
        processor.queue.put(jobs[2])
        processor.queue.put(jobs[3])
        assert processor.runner.take(processor.queue.get_nowait()) == ([jobs[2]], None)
        assert processor.depth == 1
    finally:
        gate.open()
        head.result(timeout=30)
        svc.close()
