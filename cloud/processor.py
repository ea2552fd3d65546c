"""Case processing: a bounded fair queue, worker threads, and the one path every case takes
(admitted: decode + claim in the store → cascade → verdict stored → verdict published),
whether it came by MQTT or REST. The pieces: `Admission` (the way in), `CaseRunner` (a
job's run), `Answers` (the way out), `StaleSweep`, and `Lag` (what verdicts say of the
queue).

A REST case is admitted on the request's thread, so its client hears 400/409 at once; an
MQTT case is admitted by the worker that runs it (never on the network thread).

Backpressure: REST submissions are refused with `Overloaded` (429 + Retry-After) once
`max_pending` cases wait. MQTT cases are flow-controlled by the broker instead: we ack
a message only after its verdict is stored, and the broker sends at most
`receive_maximum` unacknowledged messages, so the queue cannot grow past that either.
A redelivery of a case someone else owns is held (not acked) in `HeldRedeliveries`, bounded
by `max_held`; the stale sweep never queues a case that is already queued or held.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

from edgefleet.cloud.admission import Admission
from edgefleet.cloud.answers import Answers
from edgefleet.cloud.cascade import Cascade
from edgefleet.cloud.fair_queue import FairQueue
from edgefleet.cloud.held import HeldRedeliveries
from edgefleet.cloud.jobs import CASES, QUEUE_DEPTH, DecodeImage, Job, Publisher, StatusPublisher
from edgefleet.cloud.lag import Lag
from edgefleet.cloud.ledger import ClaimState
from edgefleet.cloud.lookup import CaseKey, case_key
from edgefleet.cloud.router import Router
from edgefleet.cloud.runner import CaseRunner
from edgefleet.cloud.store import CaseStore
from edgefleet.cloud.sweep import StaleSweep
from edgefleet.shared.errors import Conflict
from edgefleet.shared.messages import CaseId, CloudVerdict, EscalationCase


class CaseProcessor:
    def __init__(
        self,
        store: CaseStore,
        router: Router,
        cascade: Cascade,
        decode: DecodeImage,
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
        self.decode = decode
        self.queue: FairQueue[Job] = FairQueue()
        # MQTT redeliveries of cases someone else owns, waiting to be checked again
        self.held: HeldRedeliveries[CaseKey, Job] = HeldRedeliveries(max_entries=max_held)
        self.lag = Lag(self.queue, workers)
        self.admission = Admission(
            store,
            router,
            cascade,
            decode,
            self.queue,
            replica=replica,
            max_pending=max_pending,
            max_pending_per_device=max_pending_per_device,
            retry_after_s=retry_after_s,
        )
        self.answers = Answers(self.lag, publish=publish, publish_status=publish_status)
        self._stopping = threading.Event()
        self.runner = CaseRunner(
            self.admission,
            cascade,
            self.answers,
            self.lag,
            self.held,
            self._stopping,
            batch_max=batch_max,
            recheck_s=recheck_s,
        )
        self.sweeper = StaleSweep(self.admission, self.held, every_s=sweep_s)
        self._workers = [
            threading.Thread(target=self._loop, name=f"case-worker-{i}", daemon=True)
            for i in range(max(1, workers))
        ]
        self._workers.append(
            threading.Thread(
                target=self.sweeper.run, args=(self._stopping,), name="case-sweep", daemon=True
            )
        )
        self._workers.append(
            threading.Thread(
                target=self.held.run, args=(self.queue.requeue,), name="case-held", daemon=True
            )
        )
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
        return len(self.queue)

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
        self.admission.make_room(case, source, flow_controlled)
        job = self.admission.job(case, image, source=source, hold=flow_controlled, meta=meta)
        self.queue.put(job)
        QUEUE_DEPTH.set(len(self.queue))
        return job.future

    def accept(
        self, case: EscalationCase, image: bytes, *, source: str, meta: bytes | None = None
    ) -> Future[CloudVerdict | None]:
        """Admit a case now (typed errors for a bad image, `Conflict` for a case_id already
        received), then queue it; for a caller that is there to be told (REST). `meta` as
        for `submit`."""
        self.admission.make_room(case, source, flow_controlled=False)
        job = self.admission.job(case, image, source=source, meta=meta)
        try:
            claim = self.admission.admit(job, check_image=True)
        except BaseException:
            self.queue.release(job.case.device_id)
            raise
        if claim.state is not ClaimState.CLAIMED:
            self.queue.release(job.case.device_id)
            CASES.labels(source, "duplicate").inc()
            raise Conflict(
                f"case {case.case_id} was already received",
                code="duplicate_case",
                hint=f"GET /v1/escalations/{case.case_id} for its verdict",
            )
        job.claimed = True
        self.queue.claimed(case_key(case))
        self.queue.put(job)
        QUEUE_DEPTH.set(len(self.queue))
        return job.future

    def sweep(self) -> int:
        """Queue the stale cases again now (see `StaleSweep`)."""
        return self.sweeper.sweep()

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
            verdict = self.store.lookup.verdict(case_id, device_id=device_id)
            if verdict is not None or time.monotonic() >= deadline:
                return verdict
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        self._stopping.set()
        self.held.stop()
        for worker in self._workers:
            if worker.ident is not None:  # started
                worker.join(timeout=5)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                job = self.queue.get(timeout=0.5)
            except queue.Empty:
                continue
            batch, after = self.runner.take(job)
            QUEUE_DEPTH.set(len(self.queue))
            if len(batch) > 1:
                self.runner.run_batch(batch)
            else:
                self.runner.run(job)
            if after is not None:
                self.runner.run(after)
