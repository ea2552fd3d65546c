"""A case's way in: made into a job (its route and its place in the fair queue), refused
while the queue or its device's quota is full, and admitted.

`admit` is the one place a case's image is decoded and its case_id checked against the
store (the claim is the idempotency check: there is no look-up before it). Decoding comes
first, so that an image that will not decode is refused, not stored; and only when a model
level may run, or when the caller must hear that the image is bad.
"""

from __future__ import annotations

import hashlib
import logging
import time
from datetime import datetime, timezone

from edgefleet.cloud.cascade import Cascade
from edgefleet.cloud.fair_queue import FairQueue
from edgefleet.cloud.jobs import BACKPRESSURE, CASES, DecodeImage, Job
from edgefleet.cloud.ledger import Claim, ClaimState
from edgefleet.cloud.lookup import case_key
from edgefleet.cloud.router import Route, Router
from edgefleet.cloud.store import CaseStore
from edgefleet.shared.errors import Overloaded
from edgefleet.shared.messages import EscalationCase

log = logging.getLogger(__name__)


class Admission:
    def __init__(
        self,
        store: CaseStore,
        router: Router,
        cascade: Cascade,
        decode: DecodeImage,
        queue: FairQueue[Job],
        *,
        replica: str,
        max_pending: int = 256,
        max_pending_per_device: int = 32,
        retry_after_s: float = 1.0,
    ):
        self.store = store
        self.router = router
        self.cascade = cascade
        self.decode = decode
        self.queue = queue
        self.replica = replica
        self.max_pending = max_pending
        self.max_pending_per_device = max_pending_per_device
        self.retry_after_s = retry_after_s
        # a claim this replica took before it started is abandoned (a restart's)
        self.started = datetime.now(timezone.utc)

    def job(
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
            sort_key=self.queue.sort_key(route.priority, case.device_id),
            case=case,
            image=image,
            image_sha256=hashlib.sha256(image).hexdigest(),
            route=route,
            source=source,
            enqueued=time.monotonic(),
            meta=meta,
            hold=hold,
        )

    def make_room(self, case: EscalationCase, source: str, flow_controlled: bool) -> None:
        """Refuse with `Overloaded` when the queue or the device's quota is full;
        `flow_controlled` (MQTT) cases are always taken: the broker bounds them."""
        depth = len(self.queue)
        if depth >= self.max_pending:
            BACKPRESSURE.labels(source).inc()
            if not flow_controlled:
                CASES.labels(source, "overloaded").inc()
                raise Overloaded(
                    f"{depth} cases already wait for a worker", retry_after_s=self.retry_after_s
                )
        waiting = self.queue.waiting(case.device_id)
        if not flow_controlled and waiting >= self.max_pending_per_device:
            BACKPRESSURE.labels(source).inc()
            CASES.labels(source, "device_quota").inc()
            raise Overloaded(
                f"device {case.device_id} already has {self.max_pending_per_device} cases "
                "waiting (its quota)",
                retry_after_s=self.retry_after_s,
            )

    def admit(self, job: Job, *, check_image: bool = False, attempt: bool = False) -> Claim:
        """Decode the image (once) if it is needed, then claim the case. The claim also
        notes the delivery (the first time) and, with `attempt`, the run it wins."""
        if job.rgb is None and (check_image or self.needs_pixels(job.route)):
            try:
                job.rgb = self.decode(job.image)
            except BaseException:
                self._record_refused(job)
                raise
        claim = self.store.ledger.claim(
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

    def admit_run(self, job: Job) -> Claim:
        """Claim the case and count the run it wins; a case claimed before (when it was
        accepted by REST, or by a batch that failed later) only has its run counted."""
        if job.claimed:
            self.store.ledger.mark_attempt(case_key(job.case))
            return Claim(ClaimState.CLAIMED)
        return self.admit(job, attempt=True)

    def settled(self, job: Job) -> None:
        """Answered or failed: a sweep may take the case up again."""
        if job.claimed:
            self.queue.settled(case_key(job.case))

    def stale_after_s(self, route: Route | None = None) -> float:
        """A claim older than this is abandoned: well past any model deadline."""
        timeout_s = route.timeout_s if route is not None else self.router.default_timeout_s
        return max(60.0, timeout_s * 3)

    def needs_pixels(self, route: Route) -> bool:
        """Pixels are only needed when a model level may run."""
        return any(level < 2 for level, _ in self.cascade.levels(route))

    def _record_refused(self, job: Job) -> None:
        """A copy refused before its claim still counts as delivered (the store's audit)."""
        if job.delivered:
            return
        job.delivered = True
        try:
            self.store.ledger.record_delivery(
                job.case.case_id,
                source=job.source,
                replica=self.replica,
                device_id=job.case.device_id,
            )
        except Exception:  # the record only counts deliveries: the refusal goes on
            log.exception("recording the delivery of %s failed", job.case.case_id)
