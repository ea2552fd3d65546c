"""A rollout's bounds on its canaries (a least fps, a most p95 latency), read from the
telemetry each canary sent after it reported healthy."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from edgefleet.fleet.registry import DeviceRegistry


def bounded(dep: dict[str, Any]) -> bool:
    return dep["min_fps"] is not None or dep["max_latency_p95_ms"] is not None


class CanaryBounds:
    def __init__(self, registry: DeviceRegistry):
        self.registry = registry

    def measured(self, dep: dict[str, Any], target: dict[str, Any]) -> bool:
        """Whether the canary can be judged: no bounds, or telemetry since it was healthy."""
        return not bounded(dep) or self._fresh_summary(target) is not None

    def problem(self, dep: dict[str, Any], target: dict[str, Any]) -> str | None:
        """How the canary breaks the deployment's bounds, or None."""
        if not bounded(dep):
            return None
        summary = self._fresh_summary(target)
        if summary is None:
            return None
        fps, p95 = summary["fps"], summary["latency_p95"]
        if dep["min_fps"] is not None and (fps is None or fps < dep["min_fps"]):
            return f"fps {fps} below the bound {dep['min_fps']}"
        limit = dep["max_latency_p95_ms"]
        if limit is not None and p95 is not None and p95 > limit:
            return f"p95 latency {p95} ms above the bound {dep['max_latency_p95_ms']} ms"
        return None

    def _fresh_summary(self, target: dict[str, Any]) -> dict[str, Any] | None:
        """The device's telemetry taken after it reported healthy, or None."""
        detail = self.registry.get_device(target["device_id"])
        tel = detail.telemetry
        if not tel:
            return None
        ts = datetime.fromisoformat(tel["ts"].replace("Z", "+00:00"))
        return detail.model_dump() if ts >= target["healthy_at"] else None
