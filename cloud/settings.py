"""Settings of the cloud orchestrator: one pydantic tree, from cloud.yaml + EDGEFLEET_...

Operator API keys are configured by their SHA-256 only (`edgefleet cloud hash-key KEY`
prints it), so the config file never holds a usable secret.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from edgefleet.shared.config import Closed, EdgefleetSettings
from edgefleet.shared.executor.settings import ExecutionSettings
from edgefleet.shared.messages import Sha256
from edgefleet.shared.mqtt import MqttSettings

log = logging.getLogger(__name__)

_WILDCARD_HOSTS = ("0.0.0.0", "::", "")


class HttpSettings(Closed):
    host: str = Field("127.0.0.1", description="address uvicorn binds")
    port: int = Field(8080, ge=0, le=65535, description="HTTP port (0 = any free port)")
    max_upload_bytes: int = Field(
        8 * 1024 * 1024,
        ge=1024,
        description="largest request body; refused by Content-Length and while streaming",
    )
    max_wait_s: float = Field(
        30.0, gt=0, le=300, description="longest `?wait=` an escalation request may ask for"
    )
    events_interval_s: float = Field(
        1.0, gt=0, le=60, description="how often the dashboard's live feed sends what changed"
    )


class OperatorKey(Closed):
    name: str = Field(min_length=1, max_length=64, description="who holds the key (for logs)")
    sha256: Sha256 = Field(
        description="hex SHA-256 of the key; the key itself is not stored",
    )


class IngestSettings(Closed):
    enabled: bool = Field(True, description="subscribe to the device topics on the broker")
    share_group: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="MQTT 5 shared-subscription group: replicas in one group split the load; "
        "none = derived from the cloud's broker password, so it is no public constant",
    )
    subscription: Literal["auto", "plain", "shared"] = Field(
        "auto",
        description="`plain`: one replica; its subscriptions are kept with its session by "
        "the broker, through the broker's restart too (Mosquitto 2.0 does not restore shared "
        "ones), so nothing is lost while either restarts. `shared`: N replicas split the load "
        "through share_group. auto = shared when share_group or client_id is set (replicas "
        "named by the operator), plain otherwise",
    )
    client_id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="MQTT client id of this replica (unique per replica, stable across its "
        "restarts); none = an id kept and locked under data_dir/replicas/",
    )
    session_expiry_s: int = Field(
        300,
        ge=0,
        le=86400,
        description="how long the broker keeps this replica's session (and queues its share "
        "of the traffic) after it disconnects; a restart within it resumes the session",
    )
    receive_maximum: int = Field(
        64,
        ge=1,
        le=65535,
        description="QoS 1 messages the broker may have unacknowledged with us; we ack only "
        "after a case is stored, so this bounds ingest memory",
    )
    held_max: int | None = Field(
        None,
        ge=1,
        description="redeliveries of cases another worker or replica owns, held un-acked to "
        "be checked again; beyond, one is acked without a verdict (its owner or the stale "
        "sweep answers it); none = receive_maximum",
    )
    light_queue: int = Field(
        10_000,
        ge=1,
        description="telemetry/status/reported waiting to be stored; QoS 0 beyond is dropped",
    )
    light_queue_bytes: int = Field(
        64 * 2**20,
        ge=1,
        description="and at most this many payload bytes of them; QoS 0 beyond is dropped "
        "(QoS 1 ones are bounded by receive_maximum)",
    )
    light_workers: int = Field(2, ge=1, le=32, description="threads storing telemetry/status")
    light_flush_s: float = Field(
        0.02,
        ge=0,
        le=10,
        description="a telemetry/status batch waits up to this long for more messages before "
        "its transaction (not when the broker can send no more until we ack): replicas that "
        "each see a share of the fleet still write large batches; 0 = write what waits",
    )
    max_skew_s: float = Field(
        300.0,
        gt=0,
        description="messages whose ts is further than this from now are rejected as stale; "
        "raise it if edge outboxes may hold messages through long outages",
    )
    replay_max_entries: int = Field(
        1_000_000,
        ge=1,
        description="case ids and telemetry seqs remembered to reject replays (for twice "
        "max_skew_s, the time a message passes the staleness check); beyond, the oldest go",
    )
    replay_max_bytes: int = Field(
        256 * 2**20, ge=1, description="and at most this many bytes of them (estimated)"
    )


class LivenessSettings(Closed):
    """When the cloud, by its own clock, calls a silent device offline."""

    report_interval_s: float = Field(
        10.0,
        gt=0,
        description="how often devices send telemetry: the edge's telemetry_interval_s "
        "(keep the two equal)",
    )
    offline_after_intervals: float = Field(
        1.5,
        ge=1,
        le=100,
        description="a device not heard (telemetry or online status) for this many reporting "
        "intervals is shown offline, as when its last will comes",
    )

    @property
    def silence_s(self) -> float:
        return self.report_interval_s * self.offline_after_intervals


class QueueSettings(Closed):
    max_pending: int = Field(
        256, ge=1, description="REST escalations waiting for a worker; beyond this 429"
    )
    max_pending_per_device: int = Field(
        32,
        ge=1,
        description="REST escalations of one device waiting for a worker; beyond this 429 "
        "(its quota: one device's flood never fills the queue for the others)",
    )
    max_refusals_per_device: int = Field(
        60,
        ge=1,
        description="REST escalations of one device refused in a minute (duplicates, bad "
        "images, its quota full) before its next ones are refused at once with 429",
    )
    workers: int = Field(4, ge=1, le=64, description="threads processing cases")
    batch_max: int = Field(
        32,
        ge=1,
        le=1024,
        description="cases that need no model (rules, busy routes) a worker answers together: "
        "one transaction for their claims, one for their verdicts",
    )
    retry_after_s: float = Field(1.0, gt=0, description="Retry-After sent when full")


class ModelsSettings(Closed):
    primary: str = Field("ppocr6-cloud", description="cloud model for escalations by default")
    lighter: str = Field(
        "ppocr6-tiny", description="first fallback when the primary fails or times out"
    )
    served: list[str] = Field(
        default_factory=lambda: ["ppocr6-cloud", "ppocr6-tiny"],
        description="models POST /v1/infer/{model} may use",
    )
    preload: bool = Field(True, description="load and warm models at start (readyz waits)")
    timeout_s: float = Field(20.0, gt=0, description="default per-inference timeout")
    infer_priority: int = Field(
        0,
        ge=-100,
        le=100,
        description="priority of POST /v1/infer calls in a model's queue, beside the routes' "
        "priorities of escalations (higher runs first)",
    )
    manifest: Path | None = Field(None, description="extra model manifest merged over the default")

    @model_validator(mode="before")
    @classmethod
    def _retired(cls, data: Any) -> Any:
        """Accept a file written for 0.x: `workers_per_model` went with the per-model
        thread pools (each model's scheduler runs calls on the caller's thread)."""
        if isinstance(data, dict) and "workers_per_model" in data:
            data = {k: v for k, v in data.items() if k != "workers_per_model"}
            log.warning("models.workers_per_model is retired and ignored: remove it")
        return data


class CacheSettings(Closed):
    size: int = Field(10_000, ge=0, description="verdicts kept in memory (0 = off)")
    max_bytes: int = Field(
        64 * 2**20, ge=0, description="and at most this many bytes of them (estimated)"
    )
    min_score: float = Field(
        0.9, ge=0, le=1, description="cache only results whose every line scores at least this"
    )


class RulesSettings(Closed):
    file: Path | None = Field(None, description="routing rules YAML; none = default route only")
    poll_s: float = Field(1.0, gt=0, description="how often the file's mtime is checked")
    accept_edge_min_score: float = Field(
        0.5, ge=0, le=1, description="rule-based level: edge lines at or above this are kept"
    )


class TelemetrySettings(Closed):
    bucket_s: int = Field(60, ge=1, description="telemetry history keeps one sample per bucket")
    retention_days: int = Field(30, ge=1, description="older telemetry samples are pruned")


class DriftSettings(Closed):
    window_days: float = Field(7.0, gt=0, description="current window: the last N days")
    reference_days: float = Field(
        28.0, gt=0, description="reference window: the N days before the current one"
    )
    min_samples: int = Field(20, ge=2, description="no statistic below this many samples")
    interval_s: float = Field(300.0, gt=0, description="how often drift metrics are recomputed")


class ImageLimitSettings(Closed):
    max_pixels: int = Field(40_000_000, ge=1, description="width x height above this is refused")
    max_side: int = Field(16_384, ge=1, description="longest side above this is refused")
    max_decode_bytes: int = Field(
        256 * 2**20,
        ge=2**20,
        description="bytes one image may take to decode (width x height x channels x bytes "
        "per sample from its header, with the RGB copies); beyond, 413 before decoding",
    )
    decode_budget_bytes: int = Field(
        384 * 2**20,
        ge=2**20,
        description="bytes all images being decoded or waiting for a model may take at once "
        "(REST and MQTT together); a decode reserves its bytes before it starts",
    )
    decode_wait_s: float = Field(
        2.0,
        ge=0,
        le=60,
        description="how long a decode waits for room in decode_budget_bytes before it is "
        "refused with 503 + Retry-After (an MQTT case: counted and acknowledged)",
    )

    @model_validator(mode="after")
    def _one_fits(self) -> ImageLimitSettings:
        if self.max_decode_bytes > self.decode_budget_bytes:
            raise ValueError("max_decode_bytes must not exceed decode_budget_bytes")
        return self


class CloudSettings(EdgefleetSettings):
    """Everything `edgefleet cloud serve` needs; every field has a working default."""

    model_config = EdgefleetSettings.model_config | {"env_prefix": "EDGEFLEET_CLOUD_"}

    http: HttpSettings = Field(default_factory=HttpSettings, description="REST server")
    mqtt: MqttSettings = Field(default_factory=MqttSettings, description="broker connection")
    ingest: IngestSettings = Field(default_factory=IngestSettings, description="MQTT ingest")
    queue: QueueSettings = Field(default_factory=QueueSettings, description="case processing")
    liveness: LivenessSettings = Field(
        default_factory=LivenessSettings, description="offline devices by the cloud's clock"
    )
    data_dir: Path = Field(
        Path("./edgefleet-data"),
        description="store, content-addressed images and the model store (data_dir/models, "
        "where `edgefleet fleet model-add` puts files) live here",
    )
    public_url: str | None = Field(
        None,
        pattern=r"^https?://[^/?#\s]+(/[^?#\s]*)?$",
        description="the cloud's URL as devices reach it (model download links in deployments); "
        "none = http://<http.host>:<http.port> (127.0.0.1 for a wildcard host); keep it equal "
        "to the fleet's public_url",
    )
    database_url: str | None = Field(
        None, description="sqlite:///abs/path.db or postgresql://...; none = SQLite in data_dir"
    )
    device_master_key: SecretStr | None = Field(
        None, description="seals device HMAC keys in the registry (Fernet); none = stored plain"
    )
    api_keys: list[OperatorKey] = Field(
        default_factory=list, description="operator API keys (by SHA-256)"
    )
    models: ModelsSettings = Field(default_factory=ModelsSettings, description="cloud models")
    execution: ExecutionSettings = Field(
        default_factory=ExecutionSettings, description="executor, batching, memory budget"
    )
    cache: CacheSettings = Field(default_factory=CacheSettings, description="verdict cache")
    rules: RulesSettings = Field(default_factory=RulesSettings, description="routing rules")
    telemetry: TelemetrySettings = Field(
        default_factory=TelemetrySettings, description="telemetry history"
    )
    drift: DriftSettings = Field(default_factory=DriftSettings, description="edge score drift")
    images: ImageLimitSettings = Field(
        default_factory=ImageLimitSettings, description="decode limits for uploaded images"
    )
    log_level: str = Field("INFO", description="log level")

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'cloud.db'}"

    def ingest_share_group(self) -> str | None:
        """The shared-subscription group the ingest joins; None = plain subscriptions."""
        mode = self.ingest.subscription
        if mode == "auto":
            mode = "shared" if self.ingest.share_group or self.ingest.client_id else "plain"
        return self.resolved_share_group() if mode == "shared" else None

    def resolved_share_group(self) -> str:
        """The configured group, or one derived from the cloud's broker password: every
        replica with the same credentials lands in the same group, nobody else can name it."""
        if self.ingest.share_group:
            return self.ingest.share_group
        secret = self.mqtt.password or self.mqtt.username or "anonymous"
        return "ef-" + hashlib.sha256(b"ef-share-group\n" + secret.encode()).hexdigest()[:16]

    def resolved_public_url(self) -> str:
        """`public_url`, or one made from where uvicorn binds (a wildcard becomes loopback)."""
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.http.host in _WILDCARD_HOSTS else self.http.host
        if ":" in host:  # an IPv6 literal
            host = f"[{host}]"
        return f"http://{host}:{self.http.port}"
