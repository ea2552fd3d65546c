"""The seam between the orchestrator and the device registry
(edgefleet.fleet.registry.DeviceRegistry).

The cloud needs only these calls of a registry: the HMAC key of a device (wire signatures),
the device a REST token belongs to, hooks for status/telemetry/reported messages, and
`mark_silent` for the liveness watch (edgefleet.cloud.liveness).
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime
from typing import Protocol, runtime_checkable

from edgefleet.shared.messages import DeviceStatus, DeviceTelemetry, ReportedState, utcnow


@runtime_checkable
class Registry(Protocol):
    """What the cloud asks of the device registry."""

    def device_key(self, device_id: str) -> bytes | None:
        """The device's HMAC key, or None if it is not enrolled (or revoked)."""

    def authenticate_token(self, token: str) -> str | None:
        """The device id a REST bearer token belongs to, or None."""

    def record_status(self, status: DeviceStatus) -> None:
        """Remember the device's last online/offline state."""

    def record_telemetry(self, telemetry: DeviceTelemetry) -> None:
        """Remember the device's last telemetry for the fleet view."""

    def record_telemetries(self, batch: Sequence[DeviceTelemetry]) -> None:
        """`record_telemetry` of each, in ts order (a store may do it in fewer statements)."""

    def record_reported(self, reported: ReportedState) -> None:
        """Remember the deployment state the device reports."""

    def batch(self) -> AbstractContextManager[object]:
        """Records made inside the block are committed together (one transaction)."""

    def mark_silent(self, heard_before: datetime) -> list[str]:
        """Mark offline the online devices last heard alive before `heard_before` (the
        cloud's clock); their ids."""


class StaticRegistry:
    """A fixed set of devices held in memory: for `cloud serve` without a fleet database
    (keys from a file) and for benchmarks; it remembers the last message of each kind."""

    def __init__(self, devices: dict[str, tuple[bytes, str | None]] | None = None):
        self._keys: dict[str, bytes] = {}
        self._tokens: dict[str, str] = {}
        self._lock = threading.Lock()
        self.last_status: dict[str, DeviceStatus] = {}
        self.last_telemetry: dict[str, DeviceTelemetry] = {}
        self.last_reported: dict[str, ReportedState] = {}
        self.heard: dict[str, datetime] = {}  # last heard alive, by our clock
        self.silent: set[str] = set()  # marked offline by `mark_silent`
        for device_id, (key, token) in (devices or {}).items():
            self.add(device_id, key, token)

    def add(self, device_id: str, key: bytes, token: str | None = None) -> None:
        with self._lock:
            self._keys[device_id] = key
            if token:
                self._tokens[hashlib.sha256(token.encode()).hexdigest()] = device_id

    def device_key(self, device_id: str) -> bytes | None:
        return self._keys.get(device_id)

    def authenticate_token(self, token: str) -> str | None:
        digest = hashlib.sha256(token.encode()).hexdigest()
        for known, device_id in self._tokens.items():
            if hmac.compare_digest(known, digest):
                return device_id
        return None

    def record_status(self, status: DeviceStatus) -> None:
        with self._lock:
            self.last_status[status.device_id] = status
            if status.state == "online":
                self._heard(status.device_id)

    def record_telemetry(self, telemetry: DeviceTelemetry) -> None:
        with self._lock:
            known = self.last_telemetry.get(telemetry.device_id)
            if known is None or known.ts < telemetry.ts:
                self.last_telemetry[telemetry.device_id] = telemetry
                self._heard(telemetry.device_id)

    def record_telemetries(self, batch: Sequence[DeviceTelemetry]) -> None:
        for telemetry in batch:
            self.record_telemetry(telemetry)

    def record_reported(self, reported: ReportedState) -> None:
        with self._lock:
            self.last_reported[reported.device_id] = reported

    def batch(self) -> AbstractContextManager[object]:
        return nullcontext()

    def mark_silent(self, heard_before: datetime) -> list[str]:
        with self._lock:
            quiet = (d for d, heard in self.heard.items() if heard < heard_before)
            newly = sorted(d for d in quiet if d not in self.silent)
            self.silent.update(newly)
            return newly

    def _heard(self, device_id: str) -> None:
        self.heard[device_id] = utcnow()
        self.silent.discard(device_id)
