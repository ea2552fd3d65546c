"""A stored verdict's way out: counted, logged, published to its device (with the
device's retained lag status, at most every `status_every_s`), and handed to the caller.

An MQTT case is acked when its future resolves, so `resolve` first waits until the broker
has the verdict: paho sends a QoS 1 publish only while its in-flight window has room and
queues the rest, but sends an ack at once, so an ack could overtake its verdict and a
crash between the two would lose the answer.
"""

from __future__ import annotations

import logging
import threading
import time

from prometheus_client import Histogram

from edgefleet.cloud.jobs import CASES, LATER, Job, Publisher, Sent, StatusPublisher
from edgefleet.cloud.lag import Lag
from edgefleet.shared.messages import CloudStatus, CloudVerdict

log = logging.getLogger(__name__)

CASE_SECONDS = Histogram(
    "ef_cloud_case_seconds",
    "From enqueue to verdict stored",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
# how long an MQTT case's ack waits for the broker to take its verdict (a broker that
# takes longer is down: the case is redelivered and answered from the store)
PUBLISH_WAIT_S = 10.0


class Answers:
    def __init__(
        self,
        lag: Lag,
        *,
        publish: Publisher | None = None,
        publish_status: StatusPublisher | None = None,
        status_every_s: float = 2.0,
    ):
        self.lag = lag
        self.publish = publish
        self.publish_status = publish_status
        self.status_every_s = status_every_s
        self._lock = threading.Lock()
        self._status_sent: dict[str, float] = {}

    def answered(self, job: Job, verdict: CloudVerdict) -> None:
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
        job.sent = self.send(verdict)

    def send(self, verdict: CloudVerdict | None) -> Sent | None:
        """Publish a verdict (a failure is logged: it is stored) and refresh the lag
        status of a device that speaks ef.verdict/2."""
        if verdict is None or self.publish is None:
            return None
        sent = None
        try:
            sent = self.publish(verdict)
        except Exception:  # the verdict is stored; a publish failure is logged, not fatal
            log.exception("publishing the verdict of %s failed", verdict.case_id)
        if verdict.schema_id != "ef.verdict/1":
            self._status(verdict.device_id)
        return sent

    def resolve(
        self, job: Job, result: CloudVerdict | object | None, deadline: float | None = None
    ) -> None:
        """Hand the caller its answer, once the broker has it (MQTT); `LATER` hands nothing."""
        if result is LATER:
            return
        if job.hold and job.sent is not None:
            wait = PUBLISH_WAIT_S if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                job.sent.wait_for_publish(wait)
            except (RuntimeError, ValueError) as exc:  # not sent: the ack will not be either
                log.warning("the verdict of %s was not published: %s", job.case.case_id, exc)
        job.future.set_result(result if isinstance(result, CloudVerdict) else None)

    def _status(self, device_id: str) -> None:
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
            queue_depth=self.lag.depth,
            expected_wait_s=round(self.lag.expected_wait_s(), 3),
        )
        try:
            self.publish_status(status)
        except Exception:  # a status is advice; failing to send it is logged, not fatal
            log.exception("publishing the cloud status for %s failed", device_id)
