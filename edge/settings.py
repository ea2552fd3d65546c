"""Settings of one edge agent: one pydantic tree, from `edge.yaml` plus `EDGEFLEET_...`.

Every field has a default so that `device_id`, a device key and one stream are enough.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from edgefleet.edge.execution import edge_execution
from edgefleet.edge.sources import decoders
from edgefleet.edge.sources.settings import SourceKind as SourceKind
from edgefleet.edge.sources.settings import SourceSettings as SourceSettings
from edgefleet.shared.config import Closed, EdgefleetSettings
from edgefleet.shared.errors import ConfigError
from edgefleet.shared.executor.settings import ExecutionSettings
from edgefleet.shared.file_access import chown_hint, unreadable_reason
from edgefleet.shared.messages import DEVICE_ID_PATTERN
from edgefleet.shared.models.registry import DEFAULT_MODEL
from edgefleet.shared.mqtt import MqttSettings


class ModelSettings(Closed):
    name: str = Field(DEFAULT_MODEL, min_length=1, description="model (pack) name in the registry")
    execution: ExecutionSettings | None = Field(
        None,
        description="executor settings, over the edge's own defaults (one session thread "
        "per core share, no spinning, a batcher worker per inference worker: "
        "edgefleet.edge.execution.edge_execution); a key set in the file or the environment "
        "replaces that key only",
    )


class TrackSettings(Closed):
    """How text seen in consecutive frames is joined into tracks."""

    min_iou: float = Field(
        0.3, gt=0, le=1, description="a box overlapping a track this much joins it"
    )
    min_similarity: float = Field(
        0.6, ge=0, le=1, description="or, overlapping at all, when it reads at least this alike"
    )
    max_gap: int = Field(5, ge=0, description="a track unseen for more frames than this ends")
    ready_frames: int = Field(
        3, ge=1, description="frames a track is read on before it may be escalated"
    )
    max_reads: int = Field(50, ge=1, description="recent reads a track votes over")
    max_crops: int = Field(3, ge=1, le=8, description="best crops (sharpest x largest) kept")
    crop_margin: float = Field(
        0.3, ge=0, le=2, description="crop margin around a line, share of the line's height"
    )
    keep_ended: int = Field(
        2000, ge=1, description="ended tracks remembered, so that late verdicts still land"
    )
    revive_frames: int = Field(
        30,
        ge=0,
        description="an ended track seen again within this many frames, near "
        "where it was and reading alike, is taken up again with its answer (0: never)",
    )
    border_px: int = Field(
        2, ge=0, description="a line this close to the frame's edge is cut by it: not whole"
    )
    max_wait_frames: int = Field(
        30,
        ge=1,
        description="a track never seen whole (cut by the frame's edge) is "
        "escalated anyway after this many frames",
    )
    regrow: float = Field(
        1.6,
        gt=1,
        description="a track whose line grew this much in height since its case "
        "(text approaching) may be escalated again",
    )
    cut_level: float = Field(
        12.0,
        ge=0,
        description="a frame unlike the one before by more than this many grey levels on "
        "average (a cut, a camera moved to a preset, a video looping) ends the stream's "
        "tracks (0: never)",
    )
    change_frames: int = Field(
        8,
        ge=1,
        description="a track read, whole, unlike its text (and not as a part of it) on "
        "this many frames in a row holds another line now: it ends, and a new track starts "
        "from those frames",
    )
    max_cases: int = Field(
        2,
        ge=1,
        le=8,
        description="cases per track at most: another only once the line "
        "has come whole, grown or changed since the last",
    )
    char_width: float = Field(
        0.8,
        gt=0,
        description="a reading's box holds at most this many box heights of width per "
        "character; a reading with fewer characters than its box holds lost some (or read "
        "one wide glyph for several), and its confidence is cut in proportion",
    )


class BudgetSettings(Closed):
    """How many cases the edge may send: a share of frames and/or a rate per stream."""

    share: float = Field(
        0.1, ge=0, le=1, description="cases per frame of a stream (0.1: at most 10% of frames)"
    )
    per_min: float = Field(0.0, ge=0, description="plus this many cases per minute per stream")
    burst: int = Field(
        3, ge=1, description="credit saved up per stream, in cases; a new stream starts with it"
    )
    window_frames: int = Field(
        600, ge=10, description="recent frames and track scores the threshold is chosen over"
    )
    fps_hint: float = Field(
        10.0, gt=0, description="frames per second, to turn per_min into a share"
    )
    max_score: float = Field(
        0.97, ge=0, le=1, description="tracks surer than this are never escalated"
    )
    buckets: int = Field(10, ge=1, le=100, description="score buckets for edge/cloud agreement")
    agree_streak: int = Field(
        8, ge=1, description="a bucket whose last this many verdicts all agreed is skipped"
    )
    explore_every: int = Field(
        10, ge=1, description="one in this many candidates of a skipped bucket goes anyway"
    )
    max_wait_s: float = Field(
        5.0, gt=0, description="while the cloud reports a longer wait, the budget shrinks"
    )


class PolicySettings(Closed):
    """When a frame becomes an escalation case, and what is sent."""

    escalate: Literal["tracks", "frames"] = Field(
        "tracks",
        description="tracks: one case per unsure text track, within the budget (the unsure "
        "band is unused); frames: every frame with a score in the unsure band",
    )
    tracks: TrackSettings = Field(default_factory=TrackSettings, description="text tracks")
    budget: BudgetSettings = Field(default_factory=BudgetSettings, description="case budget")

    unsure_low: float = Field(0.3, ge=0, le=1, description="lower edge of the unsure band")
    unsure_high: float = Field(0.7, ge=0, le=1, description="upper edge of the unsure band")
    escalate_empty: bool = Field(
        True, description="escalate empty results on streams with expect_result"
    )
    sample_share: float = Field(
        0.01, ge=0, le=1, description="share of confident frames sent anyway (drift checks)"
    )
    escalate_errors: bool = Field(True, description="escalate frames the model failed on")
    rate_per_min: float = Field(
        30.0, gt=0, description="per-stream escalations per minute (token bucket refill)"
    )
    burst: int = Field(5, ge=1, description="per-stream token bucket size")
    dedup_window_s: float = Field(
        10.0, ge=0, description="near-identical frames within this window are sent once"
    )
    dedup_max_distance: int = Field(
        4, ge=0, le=64, description="Hamming distance of 64-bit dHashes counted as identical"
    )
    attach: Literal["frame", "crop"] = Field(
        "frame", description="send the whole frame or the crop around the results"
    )
    crop_margin: float = Field(0.15, ge=0, le=2, description="crop margin, share of crop size")
    max_image_side: int = Field(1280, ge=32, description="downscale larger images to this")
    jpeg_quality: int = Field(85, ge=1, le=100, description="JPEG quality of sent images")
    seed: int | None = Field(None, description="sampling seed (for reproducible runs)")

    @model_validator(mode="after")
    def _band(self) -> PolicySettings:
        if self.unsure_low > self.unsure_high:
            raise ValueError("unsure_low must not exceed unsure_high")
        return self


class OutboxSettings(Closed):
    path: Path = Field(Path("edgefleet-outbox.db"), description="SQLite outbox file")
    max_messages: int = Field(100_000, ge=10, description="outbox count bound")
    max_bytes: int = Field(512 * 1024 * 1024, ge=64 * 1024, description="outbox size bound")
    synchronous: Literal["full", "normal"] = Field(
        "full",
        description="full: every commit is fsynced (survives a power cut); normal: survives "
        "a crash of the agent, may lose the last commits on a power cut",
    )


class UplinkSettings(Closed):
    replay_rate_per_s: float = Field(
        200.0, gt=0, description="backlog messages per second after an outage (live goes first)"
    )
    resend_after_s: float = Field(
        120.0, gt=0, description="an unacknowledged message is published again after this"
    )
    restamp_after_s: float = Field(
        120.0, gt=0, description="messages older than this get a fresh ts and signature when sent"
    )
    resend_unanswered_s: float = Field(
        300.0,
        gt=0,
        description="an escalation the broker acknowledged but the cloud has not answered after "
        "this is sent again (a broker that crashes after its PUBACK loses what it held); the "
        "cloud answers a repeat from its store",
    )
    max_unanswered_resends: int = Field(
        3, ge=0, description="after this many resends an unanswered escalation is dropped, counted"
    )
    telemetry_qos: Literal[0, 1] = Field(1, description="QoS of telemetry")
    takeover_s: float = Field(
        10.0,
        gt=0,
        description="a broker connection closed sooner than this after it was made counts as "
        "taken over by another agent with this device id; an agent that never held one longer "
        "stops after 3 in a row (the device id is taken), the one that held it keeps it",
    )
    max_skew_s: float = Field(
        300.0,
        gt=0,
        description="a verdict whose ts is further than this from the device's clock is "
        "refused as stale (the cloud stamps a verdict when it sends it)",
    )


class PipelineSettings(Closed):
    infer_workers: int = Field(
        1,
        ge=1,
        le=16,
        description="threads calling the model, each session run on cores / workers ONNX "
        "Runtime threads; 1 = one frame at a time on every core, the lowest latency",
    )
    queue_size: int = Field(
        4, ge=1, le=1024, description="bound of the queue between inference and post/uplink"
    )


class HealthSettings(Closed):
    enabled: bool = Field(True, description="serve /healthz, /readyz, /metrics")
    host: str = Field("127.0.0.1", description="bind address")
    port: int = Field(8081, ge=0, le=65535, description="port (0 = any free port)")


class ClockSettings(Closed):
    """The device clock compared with the cloud's (its HTTP Date header, at `api_url`)."""

    max_skew_s: float = Field(
        300.0,
        gt=0,
        description="the cloud's `ingest.max_skew_s`: a device clock further off than this "
        "is reported (log, health, not ready), since the cloud refuses its messages as stale",
    )
    interval_s: float = Field(
        600.0, gt=0, description="seconds between checks after the one at start"
    )
    timeout_s: float = Field(5.0, gt=0, le=60, description="how long one check may take")


class RuntimeSettings(Closed):
    kind: Literal["none", "host"] = Field(
        "none",
        description="who runs a deployment's container image: `none` (the agent runs on the "
        "host; a deployment naming an image is reported `not_applied`), `host` (the host "
        "updater, `edgefleet edge updater`, applies it through updater_dir)",
    )
    updater_dir: Path = Field(
        Path("/var/lib/edgefleet/updater"),
        description="folder shared with the host updater (request.json, status.json)",
    )


class EdgeSettings(EdgefleetSettings):
    """Settings of `edgefleet edge run`."""

    model_config = SettingsConfigDict(
        env_prefix="EDGEFLEET_EDGE_", extra="forbid", env_nested_delimiter="__"
    )

    device_id: str = Field(pattern=DEVICE_ID_PATTERN, description="this device's id")
    device_key: SecretStr | None = Field(
        None, description="device key (signs messages); or give device_key_file"
    )
    device_key_file: Path | None = Field(
        None,
        description="enrollment bundle (YAML/JSON with `device_key`) or a file holding the "
        "key; a relative path is read beside the config file (`edge run -c`)",
    )
    device_token: SecretStr | None = Field(
        None, description="bearer token for fleet/cloud REST (model downloads), from enroll"
    )
    api_url: str | None = Field(
        None,
        pattern=r"^https?://[^\s/?#]+/?$",
        description="the cloud's REST base URL (from enroll): the device token is sent to this "
        "origin only, never to another host a deployment names",
    )
    agent_version: str = Field("0.1.0", max_length=64, description="reported in status")
    mqtt: MqttSettings = Field(default_factory=MqttSettings, description="broker connection")
    streams: list[SourceSettings] = Field(
        default_factory=list, max_length=64, description="video streams"
    )
    model: ModelSettings = Field(default_factory=ModelSettings, description="the edge model")
    policy: PolicySettings = Field(default_factory=PolicySettings, description="escalation")
    outbox: OutboxSettings = Field(default_factory=OutboxSettings, description="disk outbox")
    uplink: UplinkSettings = Field(default_factory=UplinkSettings, description="MQTT uplink")
    pipeline: PipelineSettings = Field(default_factory=PipelineSettings, description="threads")
    telemetry_interval_s: float = Field(10.0, gt=0, description="telemetry period")
    health: HealthSettings = Field(default_factory=HealthSettings, description="local HTTP")
    state_dir: Path = Field(Path("edgefleet-state"), description="updater state, downloads")
    runtime: RuntimeSettings = Field(
        default_factory=RuntimeSettings, description="container runtime for image changes"
    )
    clock: ClockSettings = Field(
        default_factory=ClockSettings, description="the device clock checked against the cloud's"
    )

    @classmethod
    def layered_defaults(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        """The edge's own executor tuning beneath `model.execution`, for its workers."""
        return {"model": {"execution": edge_execution(_infer_workers(given)).model_dump()}}

    @model_validator(mode="after")
    def _check(self) -> EdgeSettings:
        if self.device_key is None and self.device_key_file is None:
            raise ValueError("set device_key or device_key_file (from `edgefleet fleet enroll`)")
        ids = [s.id for s in self.streams]
        if len(ids) != len(set(ids)):
            raise ValueError("stream ids must be unique")
        known = decoders()
        for stream in self.streams:
            if stream.decoder != "auto" and stream.decoder not in known:
                raise ValueError(
                    f"stream {stream.id}: unknown decoder {stream.decoder!r}; one of auto, "
                    + ", ".join(known)
                )
        return self

    def beside(self, config_file: Path) -> EdgeSettings:
        """A relative `device_key_file` is the bundle's own, read beside edge.yaml, so one
        bundle works mounted in the container and copied to a host folder."""
        key_file = self.device_key_file
        if key_file is None or key_file.is_absolute():
            return self
        return self.model_copy(update={"device_key_file": Path(config_file).parent / key_file})

    def key_bytes(self) -> bytes:
        """The device key as bytes; ConfigError if the bundle cannot be read."""
        if self.device_key is not None:
            return _key_text_to_bytes(self.device_key.get_secret_value())
        path = self.device_key_file
        assert path is not None
        try:
            text = path.read_text()
        except PermissionError as exc:
            raise ConfigError(
                f"cannot read device_key_file {path}: {unreadable_reason(path, exc)}",
                hint=chown_hint(path),
            ) from None
        except OSError as exc:
            raise ConfigError(f"cannot read device_key_file {path}: {exc.strerror}") from None
        return _key_text_to_bytes(_key_from_bundle(text, path))


def _key_from_bundle(text: str, path: Path) -> str:
    try:
        data = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError):
        data = None
    if isinstance(data, dict):
        for name in ("device_key", "key"):
            value = data.get(name)
            if isinstance(value, str):
                return value
        device = data.get("device")
        if isinstance(device, dict) and isinstance(device_key := device.get("key"), str):
            return device_key
        raise ConfigError(f"{path}: no `device_key` in the enrollment bundle")
    key = text.strip()
    if not key:
        raise ConfigError(f"{path}: the device key file is empty")
    return key


def _key_text_to_bytes(key: str) -> bytes:
    """The key's bytes: 64 hex digits are the 32-byte key `fleet enroll` issues; any other
    text is used as its UTF-8 bytes (hand-made keys in development)."""
    key = key.strip()
    if not key:
        raise ConfigError("the device key is empty")
    if re.fullmatch(r"[0-9a-fA-F]{64}", key):
        return bytes.fromhex(key)
    return key.encode()


def _infer_workers(given: Mapping[str, Any]) -> int:
    """`pipeline.infer_workers` as given (a file, the environment, a section object), or
    its default; a bad value is left for the field's validation to report."""
    pipeline = given.get("pipeline")
    if isinstance(pipeline, PipelineSettings):
        return pipeline.infer_workers
    value = pipeline.get("infer_workers") if isinstance(pipeline, Mapping) else None
    try:
        workers = int(value) if value is not None else 1
    except (TypeError, ValueError):
        return 1
    return workers if 1 <= workers <= 16 else 1
