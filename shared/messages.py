"""Every payload of the MQTT and REST contracts, as strict pydantic models.

One source for both sides: the edge builds these, the cloud validates them, and
`edgefleet schema` exports them as JSON Schema for outside clients.
"""

from __future__ import annotations

import secrets
import typing
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    StringConstraints,
    model_validator,
)

DEVICE_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"

DeviceId = Annotated[str, StringConstraints(pattern=DEVICE_ID_PATTERN)]
TraceId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
CaseId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{8,64}$")]
StreamId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
TrackId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


def _require_utc(value: datetime) -> datetime:
    offset = value.utcoffset()
    if offset is None or offset.total_seconds() != 0:
        raise ValueError("timestamp must be UTC (ISO 8601 ending in Z or +00:00)")
    return value.astimezone(timezone.utc)


def _iso_z(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


UtcDatetime = Annotated[
    AwareDatetime,
    AfterValidator(_require_utc),
    PlainSerializer(_iso_z, return_type=str, when_used="json"),
]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def new_trace_id() -> str:
    return secrets.token_hex(16)


def new_case_id() -> str:
    return secrets.token_urlsafe(16)


class Contract(BaseModel):
    """Base of every wire model: strict, closed, serialised by alias."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        frozen=True,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )


class Message(Contract):
    """A top-level payload: it names its schema, its device and its time."""

    schema_id: str = Field(alias="schema")
    device_id: DeviceId
    ts: UtcDatetime = Field(default_factory=utcnow)


# --- shared pieces ---------------------------------------------------------------------


Precision = Literal["fp32", "fp16", "int8", "bf16"]


class ModelInfo(Contract):
    name: str = Field(min_length=1, max_length=128)
    version: str = Field(min_length=1, max_length=64)
    sha256: Sha256 | None = None
    backend: str | None = Field(default=None, description="executor backend, e.g. onnxruntime-cpu")
    precision: Precision | None = None


class Detection(Contract):
    """One result: a text line, a class, or a detection box; pinned for `infer --json`."""

    text: str | None = None
    label: str | None = None
    score: float = Field(ge=0.0, le=1.0)
    box: tuple[float, float, float, float] | None = Field(
        default=None, description="x1, y1, x2, y2 in image pixels"
    )
    polygon: list[tuple[float, float]] | None = None


class Latency(Contract):
    p50: float = Field(ge=0)
    p95: float = Field(ge=0)
    p99: float = Field(ge=0)


StreamState = Literal["connecting", "live", "stalled", "down"]


class StreamTelemetry(Contract):
    stream_id: StreamId
    state: StreamState
    fps: float = Field(ge=0)
    frames_dropped: int = Field(ge=0)
    latency_ms: Latency
    reconnects: int = Field(default=0, ge=0)


class EscalationCounters(Contract):
    sent: int = Field(ge=0)
    pending: int = Field(ge=0)
    dropped: int = Field(ge=0)


class GpuTelemetry(Contract):
    util_pct: float | None = Field(default=None, ge=0, le=100)
    mem_used_mb: float | None = Field(default=None, ge=0)
    mem_total_mb: float | None = Field(default=None, ge=0)
    temp_c: float | None = None
    power_w: float | None = Field(default=None, ge=0)


# --- the MQTT payloads -----------------------------------------------------------------


DeviceState = Literal["online", "offline"]


class DeviceStatus(Message):
    schema_id: Literal["ef.status/1"] = Field(default="ef.status/1", alias="schema")
    state: DeviceState
    agent_version: str = Field(max_length=64)


class DeviceTelemetry(Message):
    schema_id: Literal["ef.telemetry/1"] = Field(default="ef.telemetry/1", alias="schema")
    seq: int = Field(ge=0, description="per-device sequence number; a seen seq is a replay")
    uptime_s: float = Field(ge=0)
    streams: list[StreamTelemetry] = Field(default_factory=list, max_length=64)
    escalations: EscalationCounters
    outbox_depth: int = Field(ge=0)
    outbox_dropped: int = Field(default=0, ge=0)
    cpu_pct: float = Field(ge=0)
    ram_used_mb: float = Field(ge=0)
    gpu: GpuTelemetry | None = Field(default=None, description="absent on CPU-only hosts")
    model: ModelInfo | None = None
    agreement_rate: float | None = Field(default=None, ge=0, le=1)


EscalationReason = Literal["unsure", "empty", "sampled", "error", "disagreement"]
ImageContentType = Literal["image/jpeg", "image/png"]


class Tile(Contract):
    """One crop of a track, laid out in the case's image (a vertical strip of tiles)."""

    x: int = Field(ge=0, description="left of the tile in the case image, pixels")
    y: int = Field(ge=0, description="top of the tile in the case image, pixels")
    w: int = Field(ge=1, description="tile width, pixels")
    h: int = Field(ge=1, description="tile height, pixels")
    frame_index: int = Field(ge=0, description="the frame the crop was taken from")
    crop: tuple[int, int, int, int] = Field(description="x1, y1, x2, y2 of the crop in its frame")


class EscalationCase(Message):
    """Metadata of a hard case; the image travels beside it as raw bytes.

    `ef.escalation/2` (the edge's default) may name the text track the case is about and
    carry its best crops as `tiles` of the one image; `ef.escalation/1` cases (one frame
    or crop, no track) are still accepted and answered as before.
    """

    schema_id: Literal["ef.escalation/2", "ef.escalation/1"] = Field(
        default="ef.escalation/2", alias="schema"
    )
    trace_id: TraceId = Field(default_factory=new_trace_id)
    case_id: CaseId = Field(default_factory=new_case_id)
    stream_id: StreamId
    frame_index: int = Field(ge=0)
    reason: EscalationReason
    edge_result: list[Detection] = Field(default_factory=list, max_length=1000)
    model: ModelInfo
    content_type: ImageContentType
    crop: tuple[int, int, int, int] | None = Field(
        default=None, description="x1, y1, x2, y2 of the crop in the frame; null for a frame"
    )
    track_id: TrackId | None = Field(
        default=None, description="v2: the text track this case is about; its verdict applies to it"
    )
    tiles: list[Tile] = Field(
        default_factory=list,
        max_length=8,
        description="v2: the track's crops inside the image; empty = the image is one picture",
    )

    @model_validator(mode="after")
    def _version(self) -> EscalationCase:
        if self.schema_id == "ef.escalation/1" and (self.track_id or self.tiles):
            raise ValueError("track_id and tiles need schema ef.escalation/2")
        return self


class CloudVerdict(Message):
    """The cloud's answer to one case; `/2` adds the track it applies to and the cloud's lag."""

    schema_id: Literal["ef.verdict/2", "ef.verdict/1"] = Field(
        default="ef.verdict/2", alias="schema"
    )
    trace_id: TraceId
    case_id: CaseId
    result: list[Detection]
    model: str = Field(description="name@version of the model that answered, or `rules`/`busy`")
    route: str
    fallback_level: int = Field(ge=0, le=3, description="0 primary, 1 lighter, 2 rules, 3 busy")
    latency_ms: float = Field(ge=0)
    cached: bool = False
    track_id: TrackId | None = Field(
        default=None, description="v2: the case's text track; the verdict is its result"
    )
    queue_depth: int | None = Field(
        default=None, ge=0, description="v2: cases waiting at the cloud when this one was answered"
    )
    expected_wait_s: float | None = Field(
        default=None, ge=0, description="v2: how long a case sent now would wait for its verdict"
    )
    lines_unread: int | None = Field(
        default=None,
        ge=1,
        description="v2: text lines the model found but left unread (its cap on lines per "
        "image, a bound on one case's cost): the result is partial; absent when all were read",
        # left out when absent: a verdict of a case read whole is what earlier devices parse
        exclude_if=lambda unread: unread is None,
    )

    @model_validator(mode="after")
    def _version(self) -> CloudVerdict:
        v2_only = (self.track_id, self.queue_depth, self.expected_wait_s, self.lines_unread)
        if self.schema_id == "ef.verdict/1" and any(v is not None for v in v2_only):
            raise ValueError(
                "track_id, queue_depth, expected_wait_s and lines_unread need ef.verdict/2"
            )
        return self


class CloudStatus(Message):
    """How far behind the cloud is, retained on a device's results topic (refreshed as it
    answers), so a device that connects or waits knows before its next verdict."""

    schema_id: Literal["ef.cloud-status/1"] = Field(default="ef.cloud-status/1", alias="schema")
    queue_depth: int = Field(ge=0, description="cases waiting for a worker")
    expected_wait_s: float = Field(ge=0, description="how long a case sent now would wait")


# A model name or version is one path component on both sides (the cloud's store, the
# device's state folder): never "..", never a separator.
MODEL_PART_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$"


class ModelRef(Contract):
    name: str = Field(pattern=MODEL_PART_PATTERN, max_length=128)
    version: str = Field(pattern=MODEL_PART_PATTERN, max_length=64)
    url: str = Field(max_length=2048)
    sha256: Sha256


# `not_applied`: the device cannot run the deployment's image (no container runtime), so it
# never counts as healthy for it.
DeploymentStatus = Literal["applying", "healthy", "failed", "rolled_back", "not_applied"]


class DesiredState(Message):
    schema_id: Literal["ef.desired/1"] = Field(default="ef.desired/1", alias="schema")
    deployment_id: str = Field(min_length=1, max_length=64)
    image: str = Field(
        max_length=256, description="container image, `repo@sha256:...`; empty = keep the image"
    )
    models: list[ModelRef] = Field(default_factory=list, max_length=16)
    config: dict[str, Any] = Field(default_factory=dict)


class ReportedState(Message):
    schema_id: Literal["ef.reported/1"] = Field(default="ef.reported/1", alias="schema")
    deployment_id: str = Field(min_length=1, max_length=64)
    image: str = Field(max_length=256)
    models: list[ModelRef] = Field(default_factory=list, max_length=16)
    config: dict[str, Any] = Field(default_factory=dict)
    status: DeploymentStatus
    error: str | None = Field(default=None, max_length=4096)
    running_image: str | None = Field(
        default=None,
        max_length=256,
        description="the image the device runs now, as its runtime names it (None: unknown)",
    )


class Feedback(Message):
    """A label or correction of a case, from an operator or a labelling tool."""

    schema_id: Literal["ef.feedback/1"] = Field(default="ef.feedback/1", alias="schema")
    trace_id: TraceId | None = None
    case_id: CaseId
    label: str = Field(max_length=4096)
    correct: bool = Field(description="whether the cloud verdict was right")
    author: str | None = Field(default=None, max_length=128)


def _schema_ids(model: type[Message]) -> tuple[str, ...]:
    """Every schema id a model accepts (the current one first, older ones still read)."""
    return typing.get_args(model.model_fields["schema_id"].annotation)


MESSAGE_TYPES: dict[str, type[Message]] = {
    schema_id: model
    for model in (
        DeviceStatus,
        DeviceTelemetry,
        EscalationCase,
        CloudVerdict,
        CloudStatus,
        DesiredState,
        ReportedState,
        Feedback,
    )
    for schema_id in _schema_ids(model)
}


def json_schemas() -> dict[str, dict[str, Any]]:
    """The JSON Schema of every message, keyed by schema id."""
    return {
        schema_id: model.model_json_schema(by_alias=True, mode="serialization")
        for schema_id, model in MESSAGE_TYPES.items()
    }
