"""A cloud without models or a broker: the processor's tests run it on rules alone; an
ingest that is never started, fed as paho's network thread would feed it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt

from edgefleet.cloud.ingest import Ingest
from edgefleet.cloud.registry import StaticRegistry
from edgefleet.cloud.services import CloudServices
from edgefleet.cloud.settings import CloudSettings
from edgefleet.shared.imaging import encode_png
from edgefleet.shared.messages import DeviceTelemetry, EscalationCounters
from edgefleet.shared.mqtt import MqttSettings, make_client, properties
from edgefleet.shared.topics import Topics
from edgefleet.shared.wire import encode

PNG = encode_png(np.full((8, 8, 3), 90, np.uint8))


def rules_only_services(
    tmp_path: Path, *, ingest: dict[str, Any] | None = None, **queue: Any
) -> CloudServices:
    """Cloud services whose only route is the rules level, one case worker, no MQTT ingest
    (`ingest` settings still apply to what the processor reads of them)."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("default: {model: rules, timeout_s: 5}\n")
    settings = CloudSettings(
        data_dir=tmp_path / "data",
        ingest={"enabled": False, **(ingest or {})},
        models={"preload": False},
        rules={"file": rules},
        queue={"workers": 1, **queue},
    )
    return CloudServices.build(settings)


def idle_ingest(key: bytes, device_id: str = "cam-01", **options: Any) -> Ingest:
    """An ingest that is never started (no broker, nothing drains its queue): messages are
    handed to it as paho's network thread would (`deliver_telemetry`)."""
    defaults: dict[str, Any] = {"receive_maximum": 64}
    return Ingest(
        MqttSettings(),
        make_client(MqttSettings(), "idle-ingest"),
        StaticRegistry({device_id: (key, None)}),
        processor=None,  # type: ignore[arg-type]  # escalations are not sent here
        share_group="g",
        client_id="idle-ingest",
        **{**defaults, **options},
    )


def telemetry(seq: int, device_id: str = "cam-01", **fields: Any) -> DeviceTelemetry:
    """A device's telemetry message with plain figures (`fields` override them, e.g. `ts`)."""
    return DeviceTelemetry(
        device_id=device_id,
        seq=seq,
        uptime_s=1.0,
        escalations=EscalationCounters(sent=0, pending=0, dropped=0),
        outbox_depth=0,
        cpu_pct=1.0,
        ram_used_mb=1.0,
        **fields,
    )


def deliver_telemetry(
    ingest: Ingest, key: bytes, seq: int, qos: int, device_id: str = "cam-01"
) -> int:
    """One signed telemetry message into `ingest` as paho would; returns its payload size."""
    wire = encode(telemetry(seq, device_id), key, Topics().telemetry(device_id))
    message = mqtt.MQTTMessage(mid=seq, topic=wire.topic.encode())
    message.payload, message.qos = wire.payload, qos
    message.properties = properties(wire)
    ingest._on_message(ingest.client, None, message)
    return len(wire.payload)
