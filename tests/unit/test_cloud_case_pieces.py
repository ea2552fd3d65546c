"""The case processor's pieces, each built through its own constructor on a real store and
the rules route: the admission (the way in), the lag, the answers (the way out), the stale
sweep and the runner."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.bench.harness import escalation_case
from edgefleet.cloud.admission import Admission
from edgefleet.cloud.answers import Answers
from edgefleet.cloud.fair_queue import FairQueue
from edgefleet.cloud.held import HeldRedeliveries
from edgefleet.cloud.jobs import LATER, Job
from edgefleet.cloud.lag import Lag
from edgefleet.cloud.ledger import ClaimState
from edgefleet.cloud.lookup import CaseKey
from edgefleet.cloud.runner import CaseRunner
from edgefleet.cloud.services import CloudServices
from edgefleet.cloud.sweep import StaleSweep
from edgefleet.shared.errors import ImageRejected, Overloaded
from edgefleet.shared.messages import CloudStatus, CloudVerdict
from tests.support.cloud import PNG, rules_only_services


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[CloudServices]:
    """A real store, router and cascade (rules only) for the pieces to share."""
    services = rules_only_services(tmp_path)
    yield services
    services.close()


def admission(svc: CloudServices, **limits: int) -> Admission:
    return Admission(
        svc.store, svc.router, svc.cascade, svc.decode, FairQueue(), replica="piece", **limits
    )


class Transport:
    """What the answers hand verdicts and statuses to; `sent.wait_for_publish` is noted."""

    def __init__(self) -> None:
        self.verdicts: list[CloudVerdict] = []
        self.statuses: list[CloudStatus] = []
        self.waited: list[float | None] = []

    def verdict(self, verdict: CloudVerdict) -> Transport:
        self.verdicts.append(verdict)
        return self

    def status(self, status: CloudStatus) -> None:
        self.statuses.append(status)

    def wait_for_publish(self, timeout: float | None = None) -> None:
        self.waited.append(timeout)


def verdict_for(case_id: str, device_id: str = "cam-a") -> CloudVerdict:
    return CloudVerdict(
        device_id=device_id,
        trace_id="0" * 32,
        case_id=case_id,
        result=[],
        model="rules",
        route="default",
        fallback_level=2,
        latency_ms=1.0,
    )


def runner(
    svc: CloudServices, way_in: Admission, transport: Transport, *, held_max: int = 4
) -> CaseRunner:
    lag = Lag(way_in.queue, workers=1)
    answers = Answers(lag, publish=transport.verdict, publish_status=transport.status)
    held: HeldRedeliveries[CaseKey, Job] = HeldRedeliveries(max_entries=held_max)
    return CaseRunner(way_in, svc.cascade, answers, lag, held, threading.Event(), recheck_s=60)


def test_admission_refuses_past_the_queue_and_the_device_quota_but_never_mqtt(svc) -> None:
    way_in = admission(svc, max_pending=3, max_pending_per_device=1)
    # given one case of cam-a queued
    way_in.queue.put(way_in.job(escalation_case("cam-a"), PNG, source="rest"))
    # then a second REST case of cam-a is over its device's quota, one of cam-b is not
    with pytest.raises(Overloaded, match="quota"):
        way_in.make_room(escalation_case("cam-a", frame_index=1), "rest", flow_controlled=False)
    way_in.make_room(escalation_case("cam-b"), "rest", flow_controlled=False)
    # and with the queue full, REST is refused while MQTT (the broker bounds it) is taken
    for i in (2, 3):
        way_in.queue.put(way_in.job(escalation_case(f"cam-{i}"), PNG, source="rest"))
    with pytest.raises(Overloaded, match="already wait"):
        way_in.make_room(escalation_case("cam-z"), "rest", flow_controlled=False)
    way_in.make_room(escalation_case("cam-a", frame_index=9), "mqtt", flow_controlled=True)


def test_admission_claims_once_and_refuses_a_bad_image_before_storing_it(svc) -> None:
    way_in = admission(svc)
    case = escalation_case("cam-a")
    # a first copy is claimed, a second one finds the claim
    assert way_in.admit(way_in.job(case, PNG, source="rest")).state is ClaimState.CLAIMED
    assert way_in.admit(way_in.job(case, PNG, source="mqtt")).state is ClaimState.IN_PROGRESS
    # an image that will not decode is refused, counted as delivered, never stored
    bad = escalation_case("cam-b")
    truncated = way_in.job(bad, PNG[: len(PNG) // 2], source="rest")
    with pytest.raises(ImageRejected):
        way_in.admit(truncated, check_image=True)
    rows = {row["case_id"]: row for row in svc.store.ledger.accounts()}
    assert rows[case.case_id]["deliveries"] == 2
    assert rows[bad.case_id]["deliveries"] == 1 and rows[bad.case_id]["status"] is None


def test_lag_is_the_queue_ahead_served_by_every_worker_plus_one_service_time() -> None:
    waiting = [object()] * 4
    lag = Lag(waiting, workers=2)
    assert lag.expected_wait_s() == 0.0
    lag.observe(1.0)  # the moving average: 0.2 s
    assert lag.depth == 4
    assert lag.expected_wait_s() == pytest.approx((4 / 2 + 1) * 0.2)


def test_answers_send_each_verdict_and_a_throttled_status_only_to_v2_devices(svc) -> None:
    transport = Transport()
    answers = Answers(
        Lag([], workers=1), publish=transport.verdict, publish_status=transport.status
    )
    verdict = verdict_for("case-0001")
    old = verdict.model_copy(update={"schema_id": "ef.verdict/1", "device_id": "cam-o"})
    answers.send(verdict)
    answers.send(verdict.model_copy(update={"case_id": "case-0002"}))  # within status_every_s
    answers.send(old)
    assert [v.case_id for v in transport.verdicts] == ["case-0001", "case-0002", "case-0001"]
    assert [s.device_id for s in transport.statuses] == ["cam-a"]
    # a transport that fails is logged: the verdict is stored, nothing is raised
    failing = Answers(Lag([], workers=1), publish=lambda v: 1 / 0)  # type: ignore[arg-type,return-value]
    assert failing.send(verdict) is None


def test_answers_resolve_an_mqtt_case_only_once_the_broker_has_its_verdict(svc) -> None:
    way_in = admission(svc)
    transport = Transport()
    answers = Answers(Lag([], workers=1), publish=transport.verdict)
    job = way_in.job(escalation_case("cam-a"), PNG, source="mqtt", hold=True)
    verdict = verdict_for(job.case.case_id)
    answers.resolve(job, LATER)  # put back to be checked again: nothing handed over
    assert not job.future.done()
    answers.answered(job, verdict)
    answers.resolve(job, verdict)
    assert transport.waited == [10.0]
    assert job.future.result(timeout=0) == verdict


def test_the_sweep_queues_a_restarted_replicas_cases_once(svc) -> None:
    # given a case this replica claimed before it restarted
    before = admission(svc)
    case = escalation_case("cam-a")
    assert before.admit(before.job(case, PNG, source="mqtt")).state is ClaimState.CLAIMED
    after = admission(svc)
    held: HeldRedeliveries[CaseKey, Job] = HeldRedeliveries(max_entries=4)
    sweep = StaleSweep(after, held)
    # when it sweeps, twice
    assert sweep.sweep() == 1
    assert sweep.sweep() == 0  # already queued
    # then the case is queued once, as a re-run from the store
    job = after.queue.get_nowait()
    assert job.case.case_id == case.case_id and job.source == "sweep" and job.delivered
    assert len(after.queue) == 0


def test_the_runner_answers_a_case_once_and_a_copy_from_the_store(svc) -> None:
    way_in = admission(svc)
    transport = Transport()
    run = runner(svc, way_in, transport)
    case = escalation_case("cam-a")
    verdict = run.process(way_in.job(case, PNG, source="rest"))
    assert isinstance(verdict, CloudVerdict) and verdict.case_id == case.case_id
    assert svc.store.lookup.verdict(case.case_id, device_id="cam-a") == verdict
    # a copy is answered with the stored verdict, sent again, not run again
    assert run.process(way_in.job(case, PNG, source="mqtt")) == verdict
    assert [v.case_id for v in transport.verdicts] == [case.case_id] * 2
    rows = {row["case_id"]: row for row in svc.store.ledger.accounts()}
    assert rows[case.case_id]["attempts"] == 1


def test_the_runner_holds_an_mqtt_copy_of_a_case_another_owns_up_to_its_bound(svc) -> None:
    owner, way_in = admission(svc), admission(svc)
    run = runner(svc, way_in, Transport(), held_max=1)
    first, second = escalation_case("cam-a"), escalation_case("cam-b")
    for case in (first, second):  # claimed by another worker, not answered yet
        owner.admit(owner.job(case, PNG, source="rest"))
    # the first copy is held to be checked again; past the bound the next is let go
    assert run.process(way_in.job(first, PNG, source="mqtt", hold=True)) is LATER
    assert run.process(way_in.job(second, PNG, source="mqtt", hold=True)) is None
    assert len(run.held) == 1


def test_the_runner_takes_no_model_cases_as_one_batch_and_answers_each(svc) -> None:
    way_in = admission(svc)
    transport = Transport()
    run = runner(svc, way_in, transport)
    jobs = [way_in.job(escalation_case(f"cam-{i}"), PNG, source="rest") for i in range(3)]
    for job in jobs[1:]:
        way_in.queue.put(job)
    batch, after = run.take(jobs[0])
    assert batch == jobs and after is None
    run.run_batch(batch)
    verdicts = [job.future.result(timeout=30) for job in jobs]
    assert [v.case_id for v in verdicts] == [job.case.case_id for job in jobs]
    assert sorted(v.case_id for v in transport.verdicts) == sorted(v.case_id for v in verdicts)
