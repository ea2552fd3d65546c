"""Case processing: a bounded priority queue, worker threads, and the one path every case
takes (admit: decode + claim in the store → cascade → verdict stored → verdict published),
whether it came by MQTT or REST.

Cases whose route needs no model (rules, busy) take microseconds each, so the store's
commits would bound them: a worker answers such cases queued together as one batch, their
claims in one transaction and their verdicts in another. A model's cases run one per
worker, batched by the model's scheduler.

`admit` is the one place a case's image is decoded and its case_id checked against the
store (the claim is the idempotency check: there is no look-up before it). A REST case is
admitted on the request's thread, so its client hears 400/409 at once; an MQTT case is
admitted by the worker that runs it (never on the network thread).

Backpressure: REST submissions are refused with `Overloaded` (429 + Retry-After) once
`max_pending` cases wait. MQTT cases are flow-controlled by the broker instead: we ack
a message only after its verdict is stored, and the broker sends at most
`receive_maximum` unacknowledged messages, so the queue cannot grow past that either.
A redelivery of a case someone else owns is held (not acked) in `HeldRedeliveries`, bounded
by `max_held`; the stale sweep never queues a case that is already queued or held.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Protocol, TypeVar

import numpy as np
from prometheus_client import Counter, Gauge, Histogram
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from edgefleet.cloud.cascade import Cascade
from edgefleet.cloud.fair_queue import FairQueue
from edgefleet.cloud.held import HeldRedeliveries
from edgefleet.cloud.router import Route, Router
from edgefleet.cloud.store import CaseKey, Claim, ClaimState, FeedbackStore, case_key
from edgefleet.shared.db import StoreUnavailable
from edgefleet.shared.errors import Conflict, EdgefleetError, Overloaded
from edgefleet.shared.logs import trace_id_var
from edgefleet.shared.messages import CaseId, CloudStatus, CloudVerdict, EscalationCase, Sha256

log = logging.getLogger(__name__)

CASES = Counter(
    "ef_cloud_cases_total", "Cases handled, by source and outcome", ["source", "outcome"]
)
QUEUE_DEPTH = Gauge("ef_cloud_queue_depth", "Cases waiting for a worker")
BACKPRESSURE = Counter(
    "ef_cloud_backpressure_total", "Times a full queue refused or held back work", ["source"]
)
SWEPT = Counter(
    "ef_cloud_sweep_cases_total",
    "Stale cases the sweep found: requeued, or skipped as already queued or held",
    ["outcome"],
)
BATCH_SIZE = Histogram(
    "ef_cloud_case_batch_size",
    "Cases that need no model answered together (one transaction for their claims, one "
    "for their verdicts)",
    buckets=(2, 4, 8, 16, 32, 64, 128),
)
CASE_SECONDS = Histogram(
    "ef_cloud_case_seconds",
    "From enqueue to verdict stored",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)


class Sent(Protocol):
    """A verdict handed to the transport (paho's MQTTMessageInfo)."""

    def wait_for_publish(self, timeout: float | None = None) -> None: ...


Publisher = Callable[[CloudVerdict], Sent | None]
StatusPublisher = Callable[[CloudStatus], None]
Decoder = Callable[[bytes], np.ndarray]
_T = TypeVar("_T")
# how long an MQTT case's ack waits for the broker to take its verdict (a broker that
# takes longer is down: the case is redelivered and answered from the store)
PUBLISH_WAIT_S = 10.0


@dataclass(order=True)
class Job:
    sort_key: tuple[int, int, int]  # (-priority, the device's fair-share slot, arrival)
    case: EscalationCase = field(compare=False)
    image: bytes = field(compare=False)
    image_sha256: Sha256 = field(compare=False)
    route: Route = field(compare=False)
    source: str = field(compare=False)
    enqueued: float = field(compare=False)
    meta: bytes | None = field(compare=False, default=None)  # the JSON it arrived as, if any
    rgb: np.ndarray | None = field(compare=False, default=None)
    claimed: bool = field(compare=False, default=False)  # admitted before it was queued
    delivered: bool = field(compare=False, default=False)  # its arrival is in the store
    # MQTT: the message is acked only when the future resolves, so a case another worker
    # (or a crashed replica) holds is checked again later instead of being answered None
    hold: bool = field(compare=False, default=False)
    future: Future[CloudVerdict | None] = field(compare=False, default_factory=Future)
    sent: Sent | None = field(compare=False, default=None)  # its verdict, as published


_LATER = object()  # process() result: the job was put back to be checked again


class CaseProcessor:
    def __init__(
        self,
        store: FeedbackStore,
        router: Router,
        cascade: Cascade,
        decode: Decoder,
        *,
        replica: str,
        workers: int = 4,
        batch_max: int = 32,
        max_pending: int = 256,
        max_pending_per_device: int = 32,
        retry_after_s: float = 1.0,
        publish: Publisher | None = None,
        publish_status: StatusPublisher | None = None,
        recheck_s: float = 2.0,
        sweep_s: float = 30.0,
        max_held: int = 64,
    ):
        self.store = store
        self.router = router
        self.cascade = cascade
        self.decode = decode
        self.replica = replica
        self.batch_max = batch_max
        self.max_pending = max_pending
        self.max_pending_per_device = max_pending_per_device
        self.retry_after_s = retry_after_s
        self.publish = publish
        self.recheck_s = recheck_s
        self.sweep_s = sweep_s
        self.started = datetime.now(timezone.utc)
        self._queue: FairQueue[Job] = FairQueue()
        self._lock = threading.Lock()  # the service time and the statuses sent
        # MQTT redeliveries of cases someone else owns, waiting to be checked again
        self._redeliveries: HeldRedeliveries[CaseKey, Job] = HeldRedeliveries(max_entries=max_held)
        self._stopping = threading.Event()
        self._service_s = 0.0
        self.publish_status = publish_status
        self.status_every_s = 2.0
        self._status_sent: dict[str, float] = {}
        self._worker_count = max(1, workers)
        self._workers = [
            threading.Thread(target=self._loop, name=f"case-worker-{i}", daemon=True)
            for i in range(workers)
        ]
        self._workers.append(threading.Thread(target=self._sweep_loop, name="case-sweep"))
        self._workers.append(
            threading.Thread(
                target=self._redeliveries.run, args=(self._queue.requeue,), name="case-held"
            )
        )
        for worker in self._workers:
            worker.daemon = True
        self._start_lock = threading.Lock()
        self._running = False

    def start(self) -> None:
        """Start the workers, the stale sweep (which runs at once: a restarted replica's
        cases) and the redelivery checks; once everything its verdicts go through is given
        (idempotent)."""
        with self._start_lock:
            if self._running:
                return
            self._running = True
        for worker in self._workers:
            worker.start()

    @property
    def depth(self) -> int:
        return len(self._queue)

    def _observe_service(self, seconds: float) -> None:
        """Moving average of how long one case takes a worker."""
        with self._lock:
            self._service_s = 0.8 * self._service_s + 0.2 * seconds

    def expected_wait_s(self) -> float:
        """How long a case queued now waits for its verdict: the queue ahead of it, served
        by every worker, plus its own service time."""
        with self._lock:
            service = self._service_s
        return (self.depth / self._worker_count + 1) * service

    def submit(
        self,
        case: EscalationCase,
        image: bytes,
        *,
        source: str,
        flow_controlled: bool = False,
        meta: bytes | None = None,
    ) -> Future[CloudVerdict | None]:
        """Queue a case, to be admitted by the worker that takes it; the Future resolves
        to its verdict (None if another worker owns it).

        `flow_controlled` (MQTT) jobs are always taken: the broker bounds them. `meta` is
        the case's JSON as received (stored as is: a case is parsed once, not re-serialised).
        """
        self._make_room(case, source, flow_controlled)
        job = self._job(case, image, source=source, hold=flow_controlled, meta=meta)
        self._queue.put(job)
        QUEUE_DEPTH.set(len(self._queue))
        return job.future

    def accept(
        self, case: EscalationCase, image: bytes, *, source: str, meta: bytes | None = None
    ) -> Future[CloudVerdict | None]:
        """Admit a case now (typed errors for a bad image, `Conflict` for a case_id already
        received), then queue it; for a caller that is there to be told (REST). `meta` as
        for `submit`."""
        self._make_room(case, source, flow_controlled=False)
        job = self._job(case, image, source=source, meta=meta)
        try:
            claim = self.admit(job, check_image=True)
        except BaseException:
            self._queue.release(job.case.device_id)
            raise
        if claim.state is not ClaimState.CLAIMED:
            self._queue.release(job.case.device_id)
            CASES.labels(source, "duplicate").inc()
            raise Conflict(
                f"case {case.case_id} was already received",
                code="duplicate_case",
                hint=f"GET /v1/escalations/{case.case_id} for its verdict",
            )
        job.claimed = True
        self._queue.claimed(case_key(case))
        self._queue.put(job)
        QUEUE_DEPTH.set(len(self._queue))
        return job.future

    def _record_refused(self, job: Job) -> None:
        """A copy refused before its claim still counts as delivered (the store's audit)."""
        if job.delivered:
            return
        job.delivered = True
        try:
            self.store.record_delivery(
                job.case.case_id,
                source=job.source,
                replica=self.replica,
                device_id=job.case.device_id,
            )
        except Exception:  # the record only counts deliveries: the refusal goes on
            log.exception("recording the delivery of %s failed", job.case.case_id)

    def _make_room(self, case: EscalationCase, source: str, flow_controlled: bool) -> None:
        """Refuse with `Overloaded` when the queue or the device's quota is full."""
        depth = len(self._queue)
        if depth >= self.max_pending:
            BACKPRESSURE.labels(source).inc()
            if not flow_controlled:
                CASES.labels(source, "overloaded").inc()
                raise Overloaded(
                    f"{depth} cases already wait for a worker", retry_after_s=self.retry_after_s
                )
        waiting = self._queue.waiting(case.device_id)
        if not flow_controlled and waiting >= self.max_pending_per_device:
            BACKPRESSURE.labels(source).inc()
            CASES.labels(source, "device_quota").inc()
            raise Overloaded(
                f"device {case.device_id} already has {self.max_pending_per_device} cases "
                "waiting (its quota)",
                retry_after_s=self.retry_after_s,
            )

    def admit(self, job: Job, *, check_image: bool = False, attempt: bool = False) -> Claim:
        """Decode the image (once: only when a model level may run, or when the caller
        must hear that it is bad), then claim the case: the idempotency check. The claim
        also notes the delivery (the first time) and, with `attempt`, the run it wins.

        Decoding comes first so that an image that will not decode is refused, not stored.
        """
        if job.rgb is None and (check_image or self._needs_pixels(job.route)):
            try:
                job.rgb = self.decode(job.image)
            except BaseException:
                self._record_refused(job)
                raise
        claim = self.store.claim(
            job.case,
            image_sha256=job.image_sha256,
            image=job.image,
            source=job.source,
            replica=self.replica,
            stale_after_s=self.stale_after_s(job.route),
            replica_started=self.started,
            meta_json=job.meta,
            delivery=not job.delivered,
            attempt=attempt,
        )
        job.delivered = True
        return claim

    def _job(
        self,
        case: EscalationCase,
        image: bytes,
        *,
        source: str,
        hold: bool = False,
        meta: bytes | None = None,
    ) -> Job:
        route = self.router.route(case, len(image))
        return Job(
            sort_key=self._queue.sort_key(route.priority, case.device_id),
            case=case,
            image=image,
            image_sha256=hashlib.sha256(image).hexdigest(),
            route=route,
            source=source,
            enqueued=time.monotonic(),
            meta=meta,
            hold=hold,
        )

    def sweep(self) -> int:
        """Queue again the pending cases nobody works on (a crashed replica's, or this
        one's from before a restart); their claims are taken over when they run. A case
        already queued or held is left where it is: a backed-up queue is not filled again
        with the same cases every sweep."""
        stale = self.store.stale_cases(
            replica=self.replica,
            replica_started=self.started,
            stale_after_s=self.stale_after_s(),
        )
        fresh = []
        for case, image in stale:
            if not self._queue.reserve(case_key(case), held=self._redeliveries.holds):
                SWEPT.labels("already_queued").inc()
                continue
            fresh.append((case, image))
        for case, image in fresh:
            log.warning("re-running stale case %s", case.case_id, extra={"case_id": case.case_id})
            CASES.labels("sweep", "requeued").inc()
            SWEPT.labels("requeued").inc()
            job = self._job(case, image, source="sweep")
            job.delivered = True  # a re-run from the store, not a copy that arrived
            self._queue.put_reserved(job)
        QUEUE_DEPTH.set(len(self._queue))
        return len(fresh)

    def stale_after_s(self, route: Route | None = None) -> float:
        """A claim older than this is abandoned: well past any model deadline."""
        timeout_s = route.timeout_s if route is not None else self.router.default_timeout_s
        return max(60.0, timeout_s * 3)

    def _sweep_loop(self) -> None:
        while True:
            try:
                self.sweep()
            except Exception:  # a store outage: the next sweep tries again
                log.exception("sweeping stale cases failed")
            if self._stopping.wait(self.sweep_s):
                return

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                job = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            batch, after = self._take(job)
            QUEUE_DEPTH.set(len(self._queue))
            if len(batch) > 1:
                self._run_batch(batch)
            else:
                self._run(job)
            if after is not None:
                self._run(after)

    def _take(self, first: Job) -> tuple[list[Job], Job | None]:
        """The job taken and, when it needs no model, the jobs queued behind it that need
        none either (up to `batch_max`): those are answered together. A job that needs a
        model, met on the way, is returned to run on its own after them (a model's cases
        are batched by its scheduler, across workers)."""
        batch = [first]
        if self._needs_pixels(first.route):
            return batch, None
        while len(batch) < self.batch_max:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if self._needs_pixels(job.route):
                return batch, job
            batch.append(job)
        return batch, None

    def _run(self, job: Job) -> None:
        """Process one job and resolve its future, whatever happens."""
        token = trace_id_var.set(job.case.trace_id)
        try:
            self._resolve(job, self._retrying(lambda: self.process(job)))
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
            self._settled(job)

    def _run_batch(self, jobs: list[Job]) -> None:
        """Cases that need no model, answered together: their claims (and run counts) in
        one transaction, their verdicts in another, instead of two transactions per case.
        A store outage is waited out; any other failure runs the cases not yet answered
        one by one (a claim already committed is not taken again: the case is run)."""
        BATCH_SIZE.observe(len(jobs))
        unanswered = list(jobs)
        try:
            claims = self._retrying(lambda: self._admit_batch(jobs))
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
                    self._resolve(job, self._duplicate(job, claim))
                    unanswered.remove(job)
                finally:
                    trace_id_var.reset(token)
                    self._settled(job)
            self._retrying(lambda: self._save_batch([verdict for _, verdict in ran]))
        except Exception:
            log.exception("a batch of %d cases failed: running them one by one", len(jobs))
            for job in unanswered:
                self._run(job)
            return
        for job, verdict in ran:  # every verdict out first: their publishes overlap
            self._guarded(job, self._answered, verdict)
        deadline = time.monotonic() + PUBLISH_WAIT_S  # one wait for the batch, not one each
        for job, verdict in ran:
            self._guarded(job, lambda j, v: self._resolve(j, v, deadline), verdict)
            self._settled(job)

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
            with self.store.batch():
                return [self._admit_run(job) for job in jobs]
        except BaseException:  # the deliveries noted went with the transaction: note them again
            for job, before in zip(jobs, delivered, strict=True):
                job.delivered = before
            raise

    def _save_batch(self, verdicts: list[CloudVerdict]) -> None:
        with self.store.batch():
            for verdict in verdicts:
                self.store.save_verdict(verdict, replica=self.replica)

    def _resolve(
        self, job: Job, result: CloudVerdict | object | None, deadline: float | None = None
    ) -> None:
        """Hand the caller its answer. An MQTT case is acked when its future resolves, so
        it first waits until the broker has the verdict: paho sends a QoS 1 publish only
        while its in-flight window has room and queues the rest, but sends an ack at once,
        so an ack could overtake its verdict and a crash between the two would lose the answer."""
        if result is _LATER:
            return
        if job.hold and job.sent is not None:
            wait = PUBLISH_WAIT_S if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                job.sent.wait_for_publish(wait)
            except (RuntimeError, ValueError) as exc:  # not sent: the ack will not be either
                log.warning("the verdict of %s was not published: %s", job.case.case_id, exc)
        job.future.set_result(result if isinstance(result, CloudVerdict) else None)

    def _settled(self, job: Job) -> None:
        """Answered or failed: a sweep may take the case up again."""
        if job.claimed:
            self._queue.settled(case_key(job.case))

    def _retrying(self, step: Callable[[], _T]) -> _T:
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

    def _admit_run(self, job: Job) -> Claim:
        """Claim the case and count the run it wins; a case claimed before (when it was
        accepted by REST, or by a batch that failed later) only has its run counted."""
        if job.claimed:
            self.store.mark_attempt(case_key(job.case))
            return Claim(ClaimState.CLAIMED)
        return self.admit(job, attempt=True)

    def process(self, job: Job) -> CloudVerdict | object | None:
        claim = self._admit_run(job)
        if claim.state is not ClaimState.CLAIMED:
            return self._duplicate(job, claim)
        job.claimed = True  # a retry after a store outage runs it without claiming again
        verdict = self._verdict(job)
        self.store.save_verdict(verdict, replica=self.replica)
        self._answered(job, verdict)
        return verdict

    def _duplicate(self, job: Job, claim: Claim) -> CloudVerdict | object | None:
        """A case already received: answered from its stored verdict, or held until its
        owner answers (MQTT), or left to its owner."""
        if claim.state is ClaimState.DONE:
            CASES.labels(job.source, "duplicate_answered").inc()
            job.sent = self._publish(claim.verdict)
            return claim.verdict
        CASES.labels(job.source, "duplicate_in_progress").inc()
        if job.hold and not self._stopping.is_set() and self._hold(job):
            return _LATER  # not acked: checked again until its owner answers
        return None  # its owner stores and publishes the verdict (or the sweep)

    def _verdict(self, job: Job) -> CloudVerdict:
        """Run the cascade for a claimed case (not stored yet)."""
        case = job.case
        started = time.monotonic()
        outcome = self.cascade.run(job.route, case, job.rgb, job.image_sha256)
        self._observe_service(time.monotonic() - started)
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
            queue_depth=None if v1 else self.depth,
            expected_wait_s=None if v1 else round(self.expected_wait_s(), 3),
            lines_unread=None if v1 or not outcome.lines_unread else outcome.lines_unread,
        )

    def _answered(self, job: Job, verdict: CloudVerdict) -> None:
        """The verdict is stored: count it, log it, send it."""
        CASE_SECONDS.observe(time.monotonic() - job.enqueued)
        CASES.labels(job.source, "processed").inc()
        log.info(
            "case answered",
            extra={
                "case_id": verdict.case_id,
                "device_id": verdict.device_id,
                "route": verdict.route,
                "model": verdict.model,
                "fallback_level": verdict.fallback_level,
            },
        )
        job.sent = self._publish(verdict)

    def _hold(self, job: Job) -> bool:
        """Hold a redelivery until its recheck is due (its decoded pixels are dropped: the
        owner may answer first, and a takeover decodes again); False at the bound."""
        job.rgb = None
        size = len(job.image) + len(job.meta or b"")
        if self._redeliveries.hold(case_key(job.case), job, size=size, after_s=self.recheck_s):
            return True
        log.warning(
            "case %s redelivered while held elsewhere; %d redeliveries already held, so it "
            "is acked without a verdict (its owner or the stale sweep answers it)",
            job.case.case_id,
            self._redeliveries.max_entries,
            extra={"case_id": job.case.case_id},
        )
        return False

    def _needs_pixels(self, route: Route) -> bool:
        """Pixels are only needed when a model level may run."""
        return any(level < 2 for level, _ in self.cascade.levels(route))

    def _publish(self, verdict: CloudVerdict | None) -> Sent | None:
        if verdict is None or self.publish is None:
            return None
        sent = None
        try:
            sent = self.publish(verdict)
        except Exception:  # the verdict is stored; a publish failure is logged, not fatal
            log.exception("publishing the verdict of %s failed", verdict.case_id)
        if verdict.schema_id != "ef.verdict/1":  # only devices that speak /2 get a status
            self._publish_status(verdict.device_id)
        return sent

    def _publish_status(self, device_id: str) -> None:
        """Refresh the device's retained lag status, at most every `status_every_s`."""
        now = time.monotonic()
        with self._lock:
            if self.publish_status is None or (
                now - self._status_sent.get(device_id, -1e9) < self.status_every_s
            ):
                return
            self._status_sent[device_id] = now
            if len(self._status_sent) > 10_000:
                self._status_sent = {device_id: now}
        status = CloudStatus(
            device_id=device_id,
            queue_depth=self.depth,
            expected_wait_s=round(self.expected_wait_s(), 3),
        )
        try:
            self.publish_status(status)
        except Exception:  # a status is advice; failing to send it is logged, not fatal
            log.exception("publishing the cloud status for %s failed", device_id)

    def wait_verdict(
        self,
        case_id: CaseId,
        timeout_s: float,
        poll_s: float = 0.05,
        *,
        device_id: str | None = None,
    ) -> CloudVerdict | None:
        """Poll the store (another replica may own the case) until a verdict or timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            verdict = self.store.verdict(case_id, device_id=device_id)
            if verdict is not None or time.monotonic() >= deadline:
                return verdict
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        self._stopping.set()
        self._redeliveries.stop()
        for worker in self._workers:
            if worker.ident is not None:  # started
                worker.join(timeout=5)
