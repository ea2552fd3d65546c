"""Does the PUBLISH property decoder still pay? paho's own against `publish_properties`.

Run: `edgefleet bench mqtt-properties` (a few seconds).

Every message the cloud receives goes through paho's `decode_publish`, which builds the
packet's MQTT 5 properties. Here the same signed messages the edge sends (telemetry, and a
case with its JPEG) are decoded by paho's `decode_publish` as paho ships it and with
`PublishProperties` in its place, in alternating rounds in one run; the results are
compared, and the time per message and the ratio are printed.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Annotated

import typer
from paho.mqtt import _packet
from paho.mqtt.enums import MQTTProtocolVersion
from paho.mqtt.properties import Properties

from edgefleet.shared.messages import (
    Detection,
    DeviceTelemetry,
    EscalationCase,
    EscalationCounters,
    ModelInfo,
)
from edgefleet.shared.mqtt import properties
from edgefleet.shared.publish_properties import PublishProperties
from edgefleet.shared.wire import WireMessage, encode

app = typer.Typer(add_completion=False)

KEY = b"k" * 32


def _telemetry() -> WireMessage:
    t = DeviceTelemetry(
        device_id="cam-0001",
        ts=datetime.now(timezone.utc),
        seq=1,
        uptime_s=60,
        escalations=EscalationCounters(sent=3, pending=0, dropped=0),
        outbox_depth=0,
        cpu_pct=12,
        ram_used_mb=300,
    )
    return encode(t, KEY, "edgefleet/v1/devices/cam-0001/telemetry")


def _case(image: bytes) -> WireMessage:
    case = EscalationCase(
        device_id="cam-0001",
        stream_id="cam",
        frame_index=1,
        reason="unsure",
        edge_result=[Detection(text="GRR-7092", score=0.4, box=(10.0, 10.0, 90.0, 30.0))],
        model=ModelInfo(name="ppocr6-tiny", version="1"),
        content_type="image/jpeg",
    )
    return encode(case, KEY, "edgefleet/v1/devices/cam-0001/escalations", image)


def _packet_body(wire: WireMessage) -> bytes:
    """A PUBLISH as the broker forwards it, after its fixed header: topic, mid, properties,
    payload."""
    topic = wire.topic.encode()
    props = bytes(properties(wire).pack())
    return len(topic).to_bytes(2, "big") + topic + (1).to_bytes(2, "big") + props + wire.payload


def _decode_all(bodies: list[bytes], decoder: type[Properties]) -> float:
    """Seconds to decode every body with `decoder` as paho's PUBLISH properties."""
    _packet.Properties = decoder  # type: ignore[misc]
    try:
        start = time.perf_counter()
        for body in bodies:
            _packet.decode_publish(0x32, body, MQTTProtocolVersion.MQTTv5)
        return time.perf_counter() - start
    finally:
        _packet.Properties = Properties  # type: ignore[misc]


def _same(body: bytes) -> bool:
    results = []
    for decoder in (Properties, PublishProperties):
        _packet.Properties = decoder  # type: ignore[misc]
        try:
            packet = _packet.decode_publish(0x32, body, MQTTProtocolVersion.MQTTv5)
        finally:
            _packet.Properties = Properties  # type: ignore[misc]
        assert packet.properties is not None
        results.append((packet.topic, packet.payload, packet.properties.json()))
    return results[0] == results[1]


@app.command()
def main(
    messages: Annotated[int, typer.Option(help="messages per round and kind")] = 2000,
    rounds: Annotated[int, typer.Option(help="alternating rounds; the best of each counts")] = 5,
    case_kb: Annotated[int, typer.Option(help="the image a case carries, kB")] = 60,
) -> None:
    """paho's PUBLISH property decoder against edgefleet's on the edge's own messages.

    Example: edgefleet bench mqtt-properties --messages 5000 --rounds 7
    """
    image = bytes(range(256)) * (case_kb * 1000 // 256)
    kinds = {"telemetry": _telemetry(), f"case ({case_kb} kB image)": _case(image)}
    typer.echo(f"{messages} messages per round, best of {rounds} alternating rounds")
    typer.echo("| message | paho µs/msg | edgefleet µs/msg | paho / edgefleet | same result |")
    typer.echo("| --- | ---: | ---: | ---: | --- |")
    for name, wire in kinds.items():
        body = _packet_body(wire)
        bodies = [body] * messages
        paho, ours = [], []
        for _ in range(rounds):
            paho.append(_decode_all(bodies, Properties))
            ours.append(_decode_all(bodies, PublishProperties))
        p, o = min(paho) / messages * 1e6, min(ours) / messages * 1e6
        typer.echo(
            f"| {name} | {p:.1f} | {o:.1f} | {p / o:.1f}x | {'yes' if _same(body) else 'NO'} |"
        )


if __name__ == "__main__":
    app()
