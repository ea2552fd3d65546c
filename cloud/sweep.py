"""The stale sweep: pending cases nobody works on (a crashed replica's, or this one's from
before a restart) are queued again, and their claims taken over when they run.

A case already queued or held is left where it is, so a backed-up queue is not filled
again with the same cases every sweep.
"""

from __future__ import annotations

import logging
import threading

from prometheus_client import Counter

from edgefleet.cloud.admission import Admission
from edgefleet.cloud.held import HeldRedeliveries
from edgefleet.cloud.jobs import CASES, QUEUE_DEPTH, Job
from edgefleet.cloud.lookup import CaseKey, case_key

log = logging.getLogger(__name__)

SWEPT = Counter(
    "ef_cloud_sweep_cases_total",
    "Stale cases the sweep found: requeued, or skipped as already queued or held",
    ["outcome"],
)


class StaleSweep:
    def __init__(
        self,
        admission: Admission,
        held: HeldRedeliveries[CaseKey, Job],
        *,
        every_s: float = 30.0,
    ):
        self.admission = admission
        self.held = held
        self.every_s = every_s

    def sweep(self) -> int:
        """Queue the stale cases not queued or held already; how many were queued."""
        admission, queue = self.admission, self.admission.queue
        stale = admission.store.ledger.stale_cases(
            replica=admission.replica,
            replica_started=admission.started,
            stale_after_s=admission.stale_after_s(),
        )
        fresh = []
        for case, image in stale:
            if not queue.reserve(case_key(case), held=self.held.holds):
                SWEPT.labels("already_queued").inc()
                continue
            fresh.append((case, image))
        for case, image in fresh:
            log.warning("re-running stale case %s", case.case_id, extra={"case_id": case.case_id})
            CASES.labels("sweep", "requeued").inc()
            SWEPT.labels("requeued").inc()
            job = admission.job(case, image, source="sweep")
            job.delivered = True  # a re-run from the store, not a copy that arrived
            queue.put_reserved(job)
        QUEUE_DEPTH.set(len(queue))
        return len(fresh)

    def run(self, stopping: threading.Event) -> None:
        """Sweep at once (a restarted replica's cases), then every `every_s` until stopped."""
        while True:
            try:
                self.sweep()
            except Exception:  # a store outage: the next sweep tries again
                log.exception("sweeping stale cases failed")
            if stopping.wait(self.every_s):
                return
