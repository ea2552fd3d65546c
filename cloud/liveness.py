"""The cloud's own clock on device liveness: a device not heard for a while is offline.

The last will covers a device whose broker connection drops, but only after the broker's
keepalive timeout, and not at all when the cloud missed it (the cloud was down, a will from
an agent too old for its `ts`); a camera that hangs but keeps its connection never sends
one. So the cloud also marks offline every device it has not heard (telemetry or an
`online` status) for `offline_after_intervals` x `report_interval_s` of listening: counted
from when the ingest connected, so a cloud restart does not mark the fleet offline before
the queued messages arrive.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from prometheus_client import Counter

from edgefleet.cloud.registry import Registry
from edgefleet.shared.messages import utcnow

log = logging.getLogger(__name__)

MARKED_SILENT = Counter(
    "ef_cloud_devices_silent_total", "Devices marked offline for not being heard in time"
)


class LivenessWatch:
    """Marks silent devices offline while the ingest listens (one thread)."""

    def __init__(
        self,
        registry: Registry,
        *,
        silence_s: float,
        listening: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
    ):
        self.registry = registry
        self.silence_s = silence_s
        self._listening = listening
        self._clock = clock
        self._listening_since: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)

    @property
    def check_every_s(self) -> float:
        """A quarter of the silence: a device is marked within 1.25 x silence of its last word."""
        return min(5.0, max(0.1, self.silence_s / 4))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def check(self) -> list[str]:
        """One look: the devices marked offline now (none while not listening long enough)."""
        now = self._clock()
        if not self._listening():
            self._listening_since = None
            return []
        if self._listening_since is None:
            self._listening_since = now
        if now - self._listening_since < self.silence_s:
            return []
        silent = self.registry.mark_silent(utcnow() - timedelta(seconds=self.silence_s))
        for device_id in silent:
            MARKED_SILENT.inc()
            log.warning(
                "device %s not heard for %.0f s: marked offline",
                device_id,
                self.silence_s,
                extra={"device_id": device_id},
            )
        return silent

    def _run(self) -> None:
        while not self._stop.wait(self.check_every_s):
            try:
                self.check()
            except Exception:  # a store hiccup: the next look tries again
                log.exception("the liveness check failed")
