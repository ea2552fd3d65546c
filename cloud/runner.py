"""A job's run to its verdict: claimed, run through the cascade, stored, answered.

Cases whose route needs no model (rules, busy) take microseconds each, so the store's
commits would bound them: `take` gathers such cases queued together into one batch, whose
claims go in one transaction and whose verdicts in another. A model's cases run one per
worker, batched by the model's scheduler.

A copy of a case already received is answered from its stored verdict; while its owner
still works on it, an MQTT copy is held (not acked) and checked again after `recheck_s`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from prometheus_client import Histogram
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from edgefleet.cloud.admission import Admission
from edgefleet.cloud.answers import PUBLISH_WAIT_S, Answers
from edgefleet.cloud.cascade import Cascade
from edgefleet.cloud.held import HeldRedeliveries
from edgefleet.cloud.jobs import CASES, LATER, Job
from edgefleet.cloud.lag import Lag
from edgefleet.cloud.ledger import Claim, ClaimState
from edgefleet.cloud.lookup import CaseKey, case_key
from edgefleet.shared.db import StoreUnavailable
from edgefleet.shared.errors import EdgefleetError
from edgefleet.shared.logs import trace_id_var
from edgefleet.shared.messages import CloudVerdict

log = logging.getLogger(__name__)

BATCH_SIZE = Histogram(
    "ef_cloud_case_batch_size",
    "Cases that need no model answered together (one transaction for their claims, one "
    "for their verdicts)",
    buckets=(2, 4, 8, 16, 32, 64, 128),
)
_T = TypeVar("_T")


def retrying(step: Callable[[], _T]) -> _T:
    """A store outage is waited out (at-least-once); anything else fails the step."""
    for attempt in Retrying(
        retry=retry_if_exception_type(StoreUnavailable),
        wait=wait_exponential(multiplier=0.2, max=5),
        stop=stop_after_delay(120),
        reraise=True,
    ):
        with attempt:
            return step()
    raise AssertionError("unreachable: tenacity re-raises the last failure")


class CaseRunner:
    def __init__(
        self,
        admission: Admission,
        cascade: Cascade,
        answers: Answers,
        lag: Lag,
        held: HeldRedeliveries[CaseKey, Job],
        stopping: threading.Event,
        *,
        batch_max: int = 32,
        recheck_s: float = 2.0,
    ):
        self.admission = admission
        self.store = admission.store
        self.cascade = cascade
        self.answers = answers
        self.lag = lag
        self.held = held
        self.stopping = stopping
        self.batch_max = batch_max
        self.recheck_s = recheck_s

    def take(self, first: Job) -> tuple[list[Job], Job | None]:
        """The job taken and, when it needs no model, the jobs queued behind it that need
        none either (up to `batch_max`): those are answered together. A job that needs a
        model, met on the way, is returned to run on its own after them (a model's cases
        are batched by its scheduler, across workers)."""
        batch = [first]
        if self.admission.needs_pixels(first.route):
            return batch, None
        while len(batch) < self.batch_max:
            try:
                job = self.admission.queue.get_nowait()
            except queue.Empty:
                break
            if self.admission.needs_pixels(job.route):
                return batch, job
            batch.append(job)
        return batch, None

    def run(self, job: Job) -> None:
        """Process one job and resolve its future, whatever happens."""
        token = trace_id_var.set(job.case.trace_id)
        try:
            self.answers.resolve(job, retrying(lambda: self.process(job)))
        except EdgefleetError as exc:  # a typed refusal (e.g. an image that will not decode)
            log.warning("case %s refused: %s", job.case.case_id, exc)
            CASES.labels(job.source, exc.code).inc()
            job.future.set_exception(exc)
        except BaseException as exc:  # every failure reaches the caller's future
            log.exception("case %s failed", job.case.case_id)
            CASES.labels(job.source, "failed").inc()
            job.future.set_exception(exc)
        finally:
            trace_id_var.reset(token)
            job.rgb = None  # answered: its pixels go back to the decode budget now
            self.admission.settled(job)

    def run_batch(self, jobs: list[Job]) -> None:
        """Cases that need no model, answered together: their claims (and run counts) in
        one transaction, their verdicts in another, instead of two transactions per case.
        A store outage is waited out; any other failure runs the cases not yet answered
        one by one (a claim already committed is not taken again: the case is run)."""
        BATCH_SIZE.observe(len(jobs))
        unanswered = list(jobs)
        try:
            claims = retrying(lambda: self._admit_batch(jobs))
            for job, claim in zip(jobs, claims, strict=True):
                # committed: if this batch fails, its cases are run alone, not claimed again
                job.claimed = job.claimed or claim.state is ClaimState.CLAIMED
            ran: list[tuple[Job, CloudVerdict]] = []
            for job, claim in zip(jobs, claims, strict=True):
                if claim.state is ClaimState.CLAIMED:
                    ran.append((job, self._verdict(job)))
                    continue
                token = trace_id_var.set(job.case.trace_id)
                try:
                    self.answers.resolve(job, self._duplicate(job, claim))
                    unanswered.remove(job)
                finally:
                    trace_id_var.reset(token)
                    self.admission.settled(job)
            retrying(lambda: self._save_batch([verdict for _, verdict in ran]))
        except Exception:
            log.exception("a batch of %d cases failed: running them one by one", len(jobs))
            for job in unanswered:
                self.run(job)
            return
        for job, verdict in ran:  # every verdict out first: their publishes overlap
            self._guarded(job, self.answers.answered, verdict)
        deadline = time.monotonic() + PUBLISH_WAIT_S  # one wait for the batch, not one each
        for job, verdict in ran:
            self._guarded(job, lambda j, v: self.answers.resolve(j, v, deadline), verdict)
            self.admission.settled(job)

    def process(self, job: Job) -> CloudVerdict | object | None:
        """Claim, run, store and send one case: its verdict, None (another owns it) or
        `LATER` (held to be checked again)."""
        claim = self.admission.admit_run(job)
        if claim.state is not ClaimState.CLAIMED:
            return self._duplicate(job, claim)
        job.claimed = True  # a retry after a store outage runs it without claiming again
        verdict = self._verdict(job)
        self.store.ledger.save_verdict(verdict, replica=self.admission.replica)
        self.answers.answered(job, verdict)
        return verdict

    def _guarded(
        self, job: Job, step: Callable[[Job, CloudVerdict], None], verdict: CloudVerdict
    ) -> None:
        """One case's step after its batch is stored: a failure fails that case's future,
        not the worker or the other cases."""
        if job.future.done():
            return
        token = trace_id_var.set(job.case.trace_id)
        try:
            step(job, verdict)
        except Exception as exc:
            log.exception("case %s failed", job.case.case_id)
            CASES.labels(job.source, "failed").inc()
            job.future.set_exception(exc)
        finally:
            trace_id_var.reset(token)

    def _admit_batch(self, jobs: list[Job]) -> list[Claim]:
        delivered = [job.delivered for job in jobs]
        try:
            with self.store.ledger.batch():
                return [self.admission.admit_run(job) for job in jobs]
        except BaseException:  # the deliveries noted went with the transaction: note them again
            for job, before in zip(jobs, delivered, strict=True):
                job.delivered = before
            raise

    def _save_batch(self, verdicts: list[CloudVerdict]) -> None:
        with self.store.ledger.batch():
            for verdict in verdicts:
                self.store.ledger.save_verdict(verdict, replica=self.admission.replica)

    def _duplicate(self, job: Job, claim: Claim) -> CloudVerdict | object | None:
        """A case already received: answered from its stored verdict, or held until its
        owner answers (MQTT), or left to its owner."""
        if claim.state is ClaimState.DONE:
            CASES.labels(job.source, "duplicate_answered").inc()
            job.sent = self.answers.send(claim.verdict)
            return claim.verdict
        CASES.labels(job.source, "duplicate_in_progress").inc()
        if job.hold and not self.stopping.is_set() and self._hold(job):
            return LATER  # not acked: checked again until its owner answers
        return None  # its owner stores and publishes the verdict (or the sweep)

    def _verdict(self, job: Job) -> CloudVerdict:
        """Run the cascade for a claimed case (not stored yet)."""
        case = job.case
        started = time.monotonic()
        outcome = self.cascade.run(job.route, case, job.rgb, job.image_sha256)
        self.lag.observe(time.monotonic() - started)
        elapsed = time.monotonic() - job.enqueued
        v1 = case.schema_id == "ef.escalation/1"  # an old device: answer in its version
        return CloudVerdict(
            schema_id="ef.verdict/1" if v1 else "ef.verdict/2",
            device_id=case.device_id,
            trace_id=case.trace_id,
            case_id=case.case_id,
            result=outcome.result,
            model=outcome.model,
            route=job.route.name,
            fallback_level=outcome.fallback_level,
            latency_ms=round(elapsed * 1000, 3),
            cached=outcome.cached,
            track_id=None if v1 else case.track_id,
            queue_depth=None if v1 else self.lag.depth,
            expected_wait_s=None if v1 else round(self.lag.expected_wait_s(), 3),
            lines_unread=None if v1 or not outcome.lines_unread else outcome.lines_unread,
        )

    def _hold(self, job: Job) -> bool:
        """Hold a redelivery until its recheck is due (its decoded pixels are dropped: the
        owner may answer first, and a takeover decodes again); False at the bound."""
        job.rgb = None
        size = len(job.image) + len(job.meta or b"")
        if self.held.hold(case_key(job.case), job, size=size, after_s=self.recheck_s):
            return True
        log.warning(
            "case %s redelivered while held elsewhere; %d redeliveries already held, so it "
            "is acked without a verdict (its owner or the stale sweep answers it)",
            job.case.case_id,
            self.held.max_entries,
            extra={"case_id": job.case.case_id},
        )
        return False
