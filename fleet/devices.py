"""A device as the fleet names and shows it: id and group rules, the once-shown enrollment
secrets, and the summary/detail/history views the API and dashboard serve.

`edgefleet.fleet.registry.DeviceRegistry` stores devices and returns these; they stay importable
from `edgefleet.fleet.registry`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from edgefleet.shared.config import Closed
from edgefleet.shared.errors import InvalidInput
from edgefleet.shared.messages import DEVICE_ID_PATTERN, DeploymentStatus

RESERVED_NAMES = frozenset({"cloud", "admin", "operator", "ef-admin"})
GROUP_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"


@dataclass(frozen=True)
class Enrollment:
    """The secrets of a freshly enrolled device: shown once, never stored in clear."""

    device_id: str
    group: str
    device_key: bytes
    broker_password: str
    token: str


class DeviceSummary(Closed):
    """One row of the fleet view: cheap to list for a thousand devices."""

    device_id: str
    group: str
    online: bool
    offline_for_s: float | None = Field(
        None, description="seconds since the device was last heard alive, when offline"
    )
    agent_version: str | None = None
    enrolled_at: datetime
    last_seen: datetime | None = None
    deployment_id: str | None = Field(None, description="deployment the device reports")
    deployment_status: DeploymentStatus | None = None
    desired_deployment_id: str | None = None
    running_image: str | None = Field(
        None, description="the image the device last reported running (repo@sha256:...)"
    )
    model: str | None = Field(None, description="name@version the device runs")
    fps: float | None = None
    latency_p95: float | None = None
    cpu_pct: float | None = None
    gpu_util: float | None = None
    gpu_temp: float | None = None
    gpu_power: float | None = None
    outbox_depth: int | None = None
    escalation_rate: float | None = Field(None, description="escalations sent per minute")
    agreement: float | None = Field(None, description="edge-vs-cloud agreement, 0..1")
    updated_at: datetime


class DeviceDetail(DeviceSummary):
    telemetry: dict[str, Any] | None = None
    reported: dict[str, Any] | None = None
    desired: dict[str, Any] | None = None


class HistoryPoint(BaseModel):
    ts: datetime
    fps: float | None = None
    latency_p95: float | None = None
    cpu_pct: float | None = None
    gpu_util: float | None = None
    gpu_temp: float | None = None
    gpu_power: float | None = None
    outbox_depth: int | None = None
    escalation_rate: float | None = None
    agreement: float | None = None


def validate_device_id(device_id: str) -> str:
    if not re.match(DEVICE_ID_PATTERN, device_id or ""):
        raise InvalidInput(
            f"invalid device id {device_id!r}",
            hint="use 1-63 characters of a-z, 0-9 and '-', starting with a letter or digit",
        )
    if device_id in RESERVED_NAMES:
        raise InvalidInput(f"device id {device_id!r} is reserved for service accounts")
    return device_id


def validate_group(group: str) -> str:
    if not re.match(GROUP_PATTERN, group or ""):
        raise InvalidInput(
            f"invalid group {group!r}", hint="use 1-63 characters of a-z, 0-9, '_' and '-'"
        )
    return group
