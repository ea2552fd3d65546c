"""A case on its way through the processor (`Job`), what it is answered through, and the
counters every step of its way adds to."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from prometheus_client import Counter, Gauge

from edgefleet.cloud.router import Route
from edgefleet.shared.messages import CloudStatus, CloudVerdict, EscalationCase, Sha256

CASES = Counter(
    "ef_cloud_cases_total", "Cases handled, by source and outcome", ["source", "outcome"]
)
QUEUE_DEPTH = Gauge("ef_cloud_queue_depth", "Cases waiting for a worker")
BACKPRESSURE = Counter(
    "ef_cloud_backpressure_total", "Times a full queue refused or held back work", ["source"]
)


class Sent(Protocol):
    """A verdict handed to the transport (paho's MQTTMessageInfo)."""

    def wait_for_publish(self, timeout: float | None = None) -> None: ...


Publisher = Callable[[CloudVerdict], Sent | None]
StatusPublisher = Callable[[CloudStatus], None]
DecodeImage = Callable[[bytes], np.ndarray]

LATER = object()  # a run's result: the job was put back to be checked again


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
