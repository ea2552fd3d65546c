"""The ingest's light messages (telemetry, status, reported): bounded in count and bytes,
stored in batches of one transaction each, acknowledged to the broker only after it
commits."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from prometheus_client import Counter, Gauge, Histogram

from edgefleet.cloud.acks import Acks
from edgefleet.cloud.jobs import BACKPRESSURE
from edgefleet.cloud.registry import Registry
from edgefleet.shared.errors import EdgefleetError
from edgefleet.shared.gauges import observe
from edgefleet.shared.messages import DeviceStatus, DeviceTelemetry, ReportedState
from edgefleet.shared.wire import Verified

log = logging.getLogger(__name__)

LIGHT_QUEUE_DEPTH = Gauge("ef_cloud_light_queue_depth", "Telemetry/status waiting to be stored")
LIGHT_QUEUE_BYTES = Gauge(
    "ef_cloud_light_queue_bytes", "Payload bytes of the telemetry/status waiting to be stored"
)
BATCH_SIZE = Histogram(
    "ef_cloud_light_batch_size",
    "Telemetry/status/reported messages stored per transaction",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500),
)
BATCH_FALLBACKS = Counter(
    "ef_cloud_light_batch_fallbacks_total",
    "Batches whose transaction failed and were stored message by message",
)

# (channel, outcome) -> the ingest's counter child
Outcome = Callable[[str, str], None]


class Light(NamedTuple):
    """A telemetry, status or reported message waiting to be stored, and acked after."""

    verified: Verified
    mid: int
    qos: int
    size: int  # payload bytes


class LightSink:
    """Workers that store the light messages the ingest hands over (`offer`)."""

    def __init__(
        self,
        registry: Registry,
        acks: Acks,
        count: Outcome,
        *,
        max_messages: int,
        max_bytes: int,
        workers: int,
        batch_max: int,
        flush_s: float,
        on_reported: Callable[[ReportedState], None] | None = None,
    ) -> None:
        self.registry = registry
        self.on_reported = on_reported
        self._acks = acks
        self._count = count
        self._max = max_messages
        self._bytes_max = max_bytes
        self._bytes = 0  # payload bytes waiting; QoS 1 ones are bounded by the broker
        self._bytes_lock = threading.Lock()
        self._batch_max = batch_max
        self._flush_s = flush_s
        self._collecting = threading.Lock()  # one worker fills a batch while others store
        self._queue: queue.Queue[Light | None] = queue.Queue()
        # read when scraped, not set per message (a gauge update costs more than the count)
        observe(LIGHT_QUEUE_DEPTH, self, lambda sink: sink._queue.qsize())
        observe(LIGHT_QUEUE_BYTES, self, lambda sink: sink._bytes)
        self._workers = [
            threading.Thread(target=self._loop, name=f"ingest-light-{i}", daemon=True)
            for i in range(workers)
        ]

    def start(self) -> None:
        for worker in self._workers:
            worker.start()

    def stop(self) -> None:
        """Store what was handed over, then end the workers."""
        for _ in self._workers:
            self._queue.put(None)
        for worker in self._workers:
            if worker.ident is not None:  # started (services closed before start: not)
                worker.join(timeout=5)

    def waiting(self) -> int:
        """Messages handed over and not yet taken into a batch."""
        return self._queue.qsize()

    def offer(self, verified: Verified, mid: int, qos: int, size: int, channel: str) -> None:
        """Queue one message; a QoS 0 one is dropped (and counted) while the sink is full
        (QoS 1 ones are bounded by the broker's window)."""
        with self._bytes_lock:
            full = self._queue.qsize() >= self._max or (self._bytes + size > self._bytes_max)
            if qos == 0 and full:
                BACKPRESSURE.labels("mqtt_light").inc()
                self._count(channel, "dropped_full")
                return
            self._bytes += size
        self._queue.put(Light(verified, mid, qos, size))

    def _loop(self) -> None:
        """Store telemetry, status and reported messages in batches, one transaction each,
        acknowledged to the broker only after it commits. One worker at a time fills a
        batch while the others store theirs."""
        while True:
            with self._collecting:
                batch, stop = self.collect()
            if batch:
                self._store(batch)
            if stop:
                return

    def collect(self) -> tuple[list[Light], bool]:
        """The next batch, and whether the stop mark was met. Having its first message, a
        batch waits up to `flush_s` for more (a transaction costs as much as several
        messages, so a replica that sees a share of the fleet must still write large
        batches), but not once the broker can send nothing more before our acks."""
        item = self._queue.get()
        if item is None:
            return [], True
        batch = [item]
        deadline = time.monotonic() + self._flush_s
        while len(batch) < self._batch_max:
            try:
                more = self._queue.get_nowait()
            except queue.Empty:
                wait = deadline - time.monotonic()
                if wait <= 0 or self._acks.full():
                    break
                try:
                    more = self._queue.get(timeout=wait)
                except queue.Empty:
                    break
            if more is None:
                return batch, True
            batch.append(more)
        return batch, False

    def _store(self, batch: list[Light]) -> None:
        try:
            with self.registry.batch():
                # rows in one order in every replica: two batches never wait on each other
                # crosswise (a deadlock on PostgreSQL, which fails both)
                ordered = [item.verified.message for item in sorted(batch, key=_lock_order)]
                telemetry = [m for m in ordered if isinstance(m, DeviceTelemetry)]
                self.registry.record_telemetries(telemetry)
                for message in ordered:
                    if not isinstance(message, DeviceTelemetry):
                        self._record(message)
            outcomes = ["stored"] * len(batch)
        except Exception as exc:  # one bad message must not fail the rest: one by one
            BATCH_FALLBACKS.inc()
            log.warning("a batch of %d failed (%s): storing them one by one", len(batch), exc)
            outcomes = [self._record_alone(item.verified) for item in batch]
        with self._bytes_lock:
            self._bytes -= sum(item.size for item in batch)
        for (verified, mid, qos, _), outcome in zip(batch, outcomes, strict=True):
            message = verified.message
            self._count(_channel_of(message), outcome)
            if outcome == "stored" and isinstance(message, ReportedState) and self.on_reported:
                try:
                    self.on_reported(message)
                except Exception:  # the rollout controller logs its own; keep storing
                    log.exception("rollout update for %s failed", verified.device_id)
            self._acks.ack(mid, qos)
        BATCH_SIZE.observe(len(batch))

    def _record(self, message: object) -> None:
        if isinstance(message, DeviceTelemetry):
            self.registry.record_telemetry(message)
        elif isinstance(message, DeviceStatus):
            self.registry.record_status(message)
        elif isinstance(message, ReportedState):
            self.registry.record_reported(message)

    def _record_alone(self, verified: Verified) -> str:
        channel = _channel_of(verified.message)
        try:
            self._record(verified.message)
            return "stored"
        except EdgefleetError as exc:
            log.warning("storing %s from %s failed: %s", channel, verified.device_id, exc)
            return exc.code
        except Exception:  # keep the worker alive; the message is counted and logged
            log.exception("storing %s from %s failed", channel, verified.device_id)
            return "error"


def _lock_order(item: Light) -> tuple[str, float]:
    return (item.verified.device_id, item.verified.message.ts.timestamp())


def _channel_of(message: object) -> str:
    schema = getattr(message, "schema_id", "")
    return schema.split("/")[0].removeprefix("ef.")
