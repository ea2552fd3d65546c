"""Drift watch: is the edge's confidence distribution moving?

Per device and edge model, the two-sample Kolmogorov–Smirnov statistic between edge
scores of the current window (the last `window_days`) and of the reference window (the
`reference_days` before it). 0 = same distribution, 1 = disjoint. Published as a gauge
and returned for the device view.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import numpy as np
from prometheus_client import Gauge

from edgefleet.cloud.lookup import CaseLookup
from edgefleet.cloud.settings import DriftSettings

log = logging.getLogger(__name__)

DRIFT_KS = Gauge(
    "ef_cloud_edge_score_drift_ks",
    "KS statistic of edge scores, current window vs reference window",
    ["device", "model"],
)


def ks_statistic(a: np.ndarray | list[float], b: np.ndarray | list[float]) -> float:
    """sup |F_a - F_b| over the pooled sample (two-sample KS statistic)."""
    x = np.sort(np.asarray(a, dtype=np.float64))
    y = np.sort(np.asarray(b, dtype=np.float64))
    if x.size == 0 or y.size == 0:
        raise ValueError("both samples must be non-empty")
    grid = np.concatenate([x, y])
    cdf_x = np.searchsorted(x, grid, side="right") / x.size
    cdf_y = np.searchsorted(y, grid, side="right") / y.size
    return float(np.max(np.abs(cdf_x - cdf_y)))


@dataclass(frozen=True)
class DriftReading:
    device_id: str
    model: str
    ks: float
    current_n: int
    reference_n: int
    computed_at: datetime

    def to_json(self) -> dict[str, object]:
        return {
            "device_id": self.device_id,
            "model": self.model,
            "ks": self.ks,
            "current_n": self.current_n,
            "reference_n": self.reference_n,
            "computed_at": self.computed_at.isoformat().replace("+00:00", "Z"),
        }


class DriftWatch:
    def __init__(self, lookup: CaseLookup, settings: DriftSettings):
        self.lookup = lookup
        self.settings = settings
        self._latest: dict[tuple[str, str], DriftReading] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def compute(self, now: datetime | None = None) -> list[DriftReading]:
        now = now or datetime.now(timezone.utc)
        window_start = now - timedelta(days=self.settings.window_days)
        ref_start = window_start - timedelta(days=self.settings.reference_days)
        current = self.lookup.edge_scores(window_start, now)
        reference = self.lookup.edge_scores(ref_start, window_start)
        readings = []
        for key, scores in current.items():
            ref = reference.get(key, [])
            if min(len(scores), len(ref)) < self.settings.min_samples:
                continue
            reading = DriftReading(
                key[0], key[1], ks_statistic(scores, ref), len(scores), len(ref), now
            )
            readings.append(reading)
            DRIFT_KS.labels(key[0], key[1]).set(reading.ks)
        latest = {(r.device_id, r.model): r for r in readings}
        for gone in self._latest.keys() - latest.keys():  # a gauge child per live pair only
            DRIFT_KS.remove(*gone)
        self._latest = latest
        return readings

    def latest_json(self, device_id: str | None = None) -> list[dict[str, object]]:
        return [reading.to_json() for reading in self.latest(device_id)]

    def latest(self, device_id: str | None = None) -> list[DriftReading]:
        return [r for r in self._latest.values() if device_id is None or r.device_id == device_id]

    def start(self) -> None:
        if self._thread is not None:
            return

        def loop() -> None:
            while True:
                try:
                    self.compute()
                except Exception:  # drift is advisory: log and try again next interval
                    log.exception("drift computation failed")
                if self._stop.wait(self.settings.interval_s):
                    return

        self._thread = threading.Thread(target=loop, name="drift-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
