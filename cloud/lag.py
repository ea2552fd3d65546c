"""How far behind this replica is: the cases queued ahead and how long one takes a worker.
Every verdict and the retained cloud status carry it, so a device can tell a slow cloud
from a lost answer."""

from __future__ import annotations

import threading
from collections.abc import Sized


class Lag:
    def __init__(self, queue: Sized, workers: int):
        self.queue = queue
        self.workers = max(1, workers)
        self._lock = threading.Lock()
        self._service_s = 0.0

    @property
    def depth(self) -> int:
        return len(self.queue)

    def observe(self, seconds: float) -> None:
        """One case's service time, into a moving average."""
        with self._lock:
            self._service_s = 0.8 * self._service_s + 0.2 * seconds

    def expected_wait_s(self) -> float:
        """How long a case queued now waits for its verdict: the queue ahead of it, served
        by every worker, plus its own service time."""
        with self._lock:
            service = self._service_s
        return (self.depth / self.workers + 1) * service
