"""The wire, byte for byte: one of each message, encoded with fixed fields, hashes to what
the layout before the house's moves (e4980b7^) gave. A change here breaks every device and
outside client in the field: it needs a new schema id, not a new digest."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone

import pytest

from edgefleet.shared import messages as m
from edgefleet.shared.topics import Topics
from edgefleet.shared.wire import encode

TS = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)
DEVICE = "cam-01"
TOPICS = Topics()
LINE = m.Detection(
    text="GATE 12",
    score=0.91,
    box=(1.0, 2.0, 30.5, 12.0),
    polygon=[(1.0, 2.0), (30.5, 2.0), (30.5, 12.0), (1.0, 12.0)],
)
MODEL = m.ModelInfo(name="ppocr6-tiny", version="6.0", sha256="a" * 64, backend="onnxruntime-cpu")
REF = m.ModelRef(name="det", version="2", url="http://x/det", sha256="b" * 64)
FIXED = {"device_id": DEVICE, "ts": TS}
STREAM = m.StreamTelemetry(
    stream_id="s0",
    state="live",
    fps=9.5,
    frames_dropped=1,
    latency_ms=m.Latency(p50=5, p95=9, p99=12),
)
TILE = m.Tile(x=0, y=0, w=40, h=20, frame_index=3, crop=(1, 2, 41, 22))

MESSAGES = [
    (m.DeviceStatus(**FIXED, state="online", agent_version="1.0"), TOPICS.status(DEVICE), None),
    (
        m.DeviceTelemetry(
            **FIXED,
            seq=7,
            uptime_s=3.5,
            escalations=m.EscalationCounters(sent=1, pending=2, dropped=0),
            outbox_depth=4,
            cpu_pct=12.5,
            ram_used_mb=900.0,
            streams=[STREAM],
            model=MODEL,
            agreement_rate=0.8,
        ),
        TOPICS.telemetry(DEVICE),
        None,
    ),
    (
        m.EscalationCase(
            **FIXED,
            trace_id="0" * 32,
            case_id="c" * 32,
            stream_id="s0",
            frame_index=3,
            reason="unsure",
            edge_result=[LINE],
            model=MODEL,
            content_type="image/jpeg",
            track_id="s0-abc-1",
            tiles=[TILE],
        ),
        TOPICS.escalations(DEVICE),
        b"\xff\xd8jpeg",
    ),
    (
        m.CloudVerdict(
            **FIXED,
            trace_id="0" * 32,
            case_id="c" * 32,
            result=[LINE],
            model="ppocr6-cloud@6.0",
            route="default",
            fallback_level=0,
            latency_ms=12.5,
            track_id="s0-abc-1",
            queue_depth=2,
            expected_wait_s=0.5,
        ),
        TOPICS.results(DEVICE),
        None,
    ),
    (m.CloudStatus(**FIXED, queue_depth=3, expected_wait_s=1.5), TOPICS.results(DEVICE), None),
    (
        m.DesiredState(
            **FIXED,
            deployment_id="dep-1",
            image="ghcr.io/a/e@sha256:" + "c" * 64,
            models=[REF],
            config={"x": 1},
        ),
        TOPICS.desired(DEVICE),
        None,
    ),
    (
        m.ReportedState(
            **FIXED,
            deployment_id="dep-1",
            image="ghcr.io/a/e:1",
            models=[REF],
            status="healthy",
            running_image="ghcr.io/a/e:1",
        ),
        TOPICS.reported(DEVICE),
        None,
    ),
]

DIGESTS = {
    "ef.status/1": "0833b15772e19a3449adbd611e1e7efae87967789353f589aa587b6096ef3283",
    "ef.telemetry/1": "4874432dbedc65b2c731d2c90f5de1a8fea9f1e37b48bf1269a5377cca22d33a",
    "ef.escalation/2": "2697587a41bedbcfd6055e91b541bf9ad2ed6bda620ee07fc2022e852efaaa55",
    "ef.verdict/2": "06c404d4116aea3443e7f44efead995ff66b243708f742f48ff03c0560e9d7c9",
    "ef.cloud-status/1": "c35498815528251b9c73c5580d532568ff45a476200441c38edb0ea49fd0393a",
    "ef.desired/1": "fbe16ab8ee1c3e535ac76a4f0c7bf5aa16d2e339400276a69ef9d0442bac7d47",
    "ef.reported/1": "cde4dbf4871c3a31b07447aceb632c28acba3467129671da644ee7b5ae915bf3",
}


@pytest.mark.parametrize(
    ("message", "topic", "image"), MESSAGES, ids=[msg.schema_id for msg, _, _ in MESSAGES]
)
def test_each_message_travels_as_the_same_bytes_as_before(message, topic, image) -> None:
    wire = encode(message, b"k" * 32, topic, image)
    laid_out = [wire.topic, wire.payload.hex(), [list(p) for p in wire.user_properties]]
    blob = json.dumps([*laid_out, wire.content_type]).encode()
    assert hashlib.sha256(blob).hexdigest() == DIGESTS[message.schema_id]


def test_every_message_kind_is_pinned() -> None:
    assert {msg.schema_id for msg, _, _ in MESSAGES} == set(DIGESTS)
