"""A deployment as operators see it: the request they send, its validation, and its view.

`edgefleet.fleet.rollout.RolloutController` turns a `DeploymentRequest` into desired states and
reports progress as a `DeploymentView`; the REST API and the CLI speak these models.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from edgefleet.shared.config import Closed
from edgefleet.shared.errors import InvalidInput
from edgefleet.shared.messages import MODEL_PART_PATTERN, ModelRef, Sha256

# A docker image reference with an explicit tag or digest (no implicit `latest` in a rollout).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9-]+)*(?::[0-9]+)?/)"
IMAGE_RE = re.compile(
    rf"^{_DOMAIN}?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}(?:@sha256:[a-f0-9]{64})?|@sha256:[a-f0-9]{64})$"
)

Status = Literal["canary", "rolling", "completed", "failed", "rolled_back", "halted"]
# One device of a rollout: pending until its desired state is sent, then what it reports.
TargetState = Literal["pending", "sent", "applying", "healthy", "failed", "rolled_back"]


class DeploymentModel(Closed):
    """A model of a deployment: `url` and `sha256` may be left out to take them from the store."""

    name: str = Field(pattern=MODEL_PART_PATTERN, max_length=128, description="model name")
    version: str = Field(pattern=MODEL_PART_PATTERN, max_length=64, description="model version")
    url: str | None = Field(None, max_length=2048, description="download URL (http/https)")
    sha256: Sha256 | None = Field(None, description="lowercase hex SHA-256 of the file")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("url must be http:// or https://")
        return value


class DeploymentRequest(Closed):
    """What an operator asks for (`POST /v1/deployments`, `edgefleet fleet deploy`)."""

    group: str = Field(description="device group to roll out to")
    image: str = Field(
        max_length=256,
        description="container image by digest (repo@sha256:...), or with a tag, which is "
        "resolved to its digest at deploy time",
    )
    models: list[DeploymentModel] = Field(default_factory=list, max_length=16)
    config: dict[str, Any] = Field(default_factory=dict, description="pipeline settings")
    canary_percent: float = Field(10.0, gt=0, le=100, description="share of the group first")
    auto_rollback: bool = Field(True, description="give canaries their previous state on failure")
    soak_s: float = Field(30.0, ge=0, le=86400, description="healthy time before the rest follow")
    min_fps: float | None = Field(None, ge=0, description="canary bound: total fps at least")
    max_latency_p95_ms: float | None = Field(None, gt=0, description="canary bound: p95 at most")

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        if not IMAGE_RE.match(value):
            raise ValueError(
                "not an image reference with a tag or digest, e.g. ghcr.io/acme/edge:1.4.2 "
                "or ghcr.io/acme/edge@sha256:<64 hex>"
            )
        return value


class TargetView(BaseModel):
    device_id: str
    role: Literal["canary", "rest"]
    state: TargetState
    healthy_at: datetime | None = None
    error: str | None = None


class DeploymentView(BaseModel):
    id: str
    group: str
    image: str = Field(description="what the devices are sent: repo@sha256:... where resolved")
    image_requested: str = Field(description="the image as the operator named it (a tag)")
    models: list[ModelRef]
    config: dict[str, Any]
    status: Status
    error: str | None = None
    auto_rollback: bool
    soak_s: float
    created_at: datetime
    updated_at: datetime
    canaries: list[str]
    targets: list[TargetView]
    counts: dict[str, int] = Field(description="targets per state")


def parse_request(data: Any) -> DeploymentRequest:
    """Validate a request body; InvalidInput (422) naming the first bad field."""
    try:
        return DeploymentRequest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise InvalidInput(f"{where}: {first['msg']}") from None
