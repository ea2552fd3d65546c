"""The device's clock against the cloud's, at agent start and every `clock.interval_s`.

A Jetson without an RTC battery boots with a wrong clock until time sync catches up; the
cloud then refuses everything the device sends as stale (`ts` further than its max skew
from now) and nothing on the device says why. The reference is the `Date` header of the
cloud's REST API, which the device already talks to (`api_url`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Literal

import httpx
from prometheus_client import Gauge

from edgefleet.edge.settings import ClockSettings

log = logging.getLogger(__name__)

OFFSET = Gauge(
    "ef_edge_clock_offset_seconds",
    "The device's clock minus the cloud's, from the cloud's HTTP Date header (NaN: unknown)",
)

ClockState = Literal["ok", "off", "unknown"]


@dataclass(frozen=True)
class ClockReading:
    """One comparison; `offset_s` is device minus cloud (positive: the device is ahead)."""

    state: ClockState
    detail: str
    offset_s: float | None = None
    uncertainty_s: float | None = None
    reference: str | None = None
    device_time: str | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def read_offset(url: str, *, now: Callable[[], float], timeout_s: float) -> tuple[float, float]:
    """(device minus cloud, uncertainty) in seconds, from one GET of `url`.

    The Date header has whole seconds and the answer takes a round trip: the cloud's time
    is taken as the middle of its second, at the middle of the round trip.
    """
    started = now()
    response = httpx.get(url, timeout=timeout_s)
    ended = now()
    header = response.headers.get("date")
    if header is None:
        raise ValueError(f"{url} sent no Date header")
    cloud = parsedate_to_datetime(header).timestamp() + 0.5
    return (started + ended) / 2 - cloud, (ended - started) / 2 + 0.5


class ClockWatch:
    """Compares the clocks at `start()` and then every `interval_s`; `latest` is the last."""

    def __init__(
        self,
        api_url: str | None,
        settings: ClockSettings,
        *,
        now: Callable[[], float] = time.time,
    ):
        self.url = f"{api_url.rstrip('/')}/healthz" if api_url else None
        self.settings = settings
        self.now = now
        self.latest = ClockReading("unknown", "not checked yet")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clock-check", daemon=True)

    def check(self) -> ClockReading:
        """Compare once, log what it found (an error when the clock is off) and keep it."""
        reading = self._compare()
        self.latest = reading
        OFFSET.set(float("nan") if reading.offset_s is None else reading.offset_s)
        level = {"ok": logging.INFO, "off": logging.ERROR, "unknown": logging.WARNING}
        log.log(level[reading.state], "clock check: %s", reading.detail, extra=reading.as_json())
        return reading

    def _compare(self) -> ClockReading:
        device_time = datetime.fromtimestamp(self.now(), timezone.utc).isoformat()
        if self.url is None:
            return ClockReading(
                "unknown",
                "no api_url: nothing to compare the device clock with",
                device_time=device_time,
            )
        try:
            offset, uncertainty = read_offset(
                self.url, now=self.now, timeout_s=self.settings.timeout_s
            )
        except (httpx.HTTPError, ValueError, TypeError) as exc:
            # an HTTPS certificate "not yet valid" is itself the sign of a clock far behind
            return ClockReading(
                "unknown",
                f"cannot read the cloud's time from {self.url}: {exc}; the device clock "
                f"reads {device_time}",
                reference=self.url,
                device_time=device_time,
            )
        limit = self.settings.max_skew_s
        if abs(offset) - uncertainty > limit:
            direction = "ahead of" if offset > 0 else "behind"
            detail = (
                f"the device clock is off: {abs(offset):.0f} s {direction} the cloud "
                f"({self.url}); the cloud refuses messages more than {limit:.0f} s off as "
                "stale. Fix the device's time sync (NTP or chrony; a Jetson without an "
                "RTC battery boots with a wrong clock)"
            )
            state: ClockState = "off"
        else:
            detail = f"within {limit:.0f} s of the cloud ({offset:+.1f} s)"
            state = "ok"
        return ClockReading(
            state, detail, round(offset, 3), round(uncertainty, 3), self.url, device_time
        )

    def start(self) -> None:
        """The first check now (what start-up logs), the next ones on a thread."""
        self.check()
        if self.url is not None:
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.settings.interval_s):
            self.check()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.settings.timeout_s + 1)
