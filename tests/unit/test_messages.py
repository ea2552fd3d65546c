"""The message contracts: strict models, UTC timestamps, JSON Schema export."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from edgefleet.shared.messages import (
    MESSAGE_TYPES,
    CloudVerdict,
    Detection,
    DeviceStatus,
    DeviceTelemetry,
    EscalationCase,
    EscalationCounters,
    Latency,
    ModelInfo,
    StreamTelemetry,
    Tile,
    json_schemas,
)


def _telemetry(**overrides) -> DeviceTelemetry:
    fields = dict(
        device_id="cam-01",
        seq=7,
        uptime_s=12.5,
        streams=[
            StreamTelemetry(
                stream_id="door",
                state="live",
                fps=14.9,
                frames_dropped=3,
                latency_ms=Latency(p50=20.0, p95=41.0, p99=60.0),
            )
        ],
        escalations=EscalationCounters(sent=4, pending=1, dropped=0),
        outbox_depth=1,
        cpu_pct=35.0,
        ram_used_mb=812.0,
    )
    fields.update(overrides)
    return DeviceTelemetry(**fields)


def test_every_message_round_trips_through_json():
    # given one instance of each message type
    case = EscalationCase(
        device_id="cam-01",
        stream_id="door",
        frame_index=10,
        reason="unsure",
        model=ModelInfo(name="ppocr", version="4"),
        content_type="image/jpeg",
        edge_result=[Detection(text="AB12", score=0.41, box=(1.0, 2.0, 30.0, 12.0))],
    )
    verdict = CloudVerdict(
        device_id="cam-01",
        trace_id=case.trace_id,
        case_id=case.case_id,
        result=[Detection(text="AB12", score=0.98)],
        model="ppocr-heavy@4",
        route="default",
        fallback_level=0,
        latency_ms=120.0,
    )
    status = DeviceStatus(device_id="cam-01", state="online", agent_version="0.1.0")
    for message in (case, verdict, status, _telemetry()):
        # when serialised and parsed back
        raw = message.model_dump_json()
        parsed = type(message).model_validate_json(raw)
        # then nothing is lost and the wire names the schema and a Z timestamp
        assert parsed == message
        doc = json.loads(raw)
        assert doc["schema"] == message.schema_id
        assert doc["ts"].endswith("Z")


@pytest.mark.parametrize(
    "ts",
    ["2026-01-01T00:00:00", "2026-01-01T00:00:00+02:00", "yesterday", 1700000000],
)
def test_naive_non_utc_or_garbage_timestamps_are_rejected(ts):
    doc = json.loads(
        DeviceStatus(device_id="cam-01", state="online", agent_version="1").model_dump_json()
    )
    doc["ts"] = ts
    with pytest.raises(ValidationError, match="ts"):
        DeviceStatus.model_validate_json(json.dumps(doc))


def test_python_side_rejects_a_naive_datetime():
    with pytest.raises(ValidationError):
        DeviceStatus(device_id="cam-01", state="online", agent_version="1", ts=datetime(2026, 1, 1))


def test_non_utc_aware_time_is_rejected_and_utc_is_kept():
    with pytest.raises(ValidationError):
        _telemetry(ts=datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=1))))
    assert _telemetry(ts=datetime(2026, 1, 1, tzinfo=timezone.utc)).ts.tzinfo == timezone.utc


@pytest.mark.parametrize(
    "field, value",
    [
        ("device_id", "Cam_01"),  # upper case and underscore are not device ids
        ("device_id", "-cam"),
        ("seq", -1),
        ("seq", "7"),  # strict: no string-to-int coercion
        ("outbox_depth", 1.5),
        ("extra_field", 1),  # closed models
    ],
)
def test_strict_models_reject_wrong_types_and_unknown_fields(field, value):
    doc = json.loads(_telemetry().model_dump_json())
    doc[field] = value
    with pytest.raises(ValidationError):
        DeviceTelemetry.model_validate_json(json.dumps(doc))


def test_schema_literal_cannot_be_swapped():
    doc = json.loads(
        DeviceStatus(device_id="cam-01", state="online", agent_version="1").model_dump_json()
    )
    doc["schema"] = "ef.telemetry/1"
    with pytest.raises(ValidationError):
        DeviceStatus.model_validate_json(json.dumps(doc))


def test_json_schemas_cover_every_message_and_use_wire_names():
    schemas = json_schemas()
    assert (
        set(schemas)
        == set(MESSAGE_TYPES)
        == {
            "ef.status/1",
            "ef.telemetry/1",
            "ef.escalation/1",
            "ef.escalation/2",
            "ef.verdict/1",
            "ef.verdict/2",
            "ef.cloud-status/1",
            "ef.desired/1",
            "ef.reported/1",
            "ef.feedback/1",
        }
    )
    for schema_id, schema in schemas.items():
        assert "schema" in schema["properties"], schema_id
        assert "schema_id" not in schema["properties"]
        assert schema["additionalProperties"] is False


@pytest.mark.parametrize("part", ["../../x", "..", "a/b", "a\\b", ".hidden", ""])
def test_a_desired_model_name_or_version_is_one_path_component(part: str) -> None:
    from edgefleet.shared.messages import DesiredState, ModelRef

    good = {"name": "det", "version": "1", "url": "https://m/det", "sha256": "a" * 64}
    for field in ("name", "version"):
        with pytest.raises(ValidationError):
            ModelRef.model_validate({**good, field: part})
    state = DesiredState(device_id="cam-01", deployment_id="d", image="e:1", models=[])
    raw = state.model_dump(mode="json", by_alias=True)
    raw["models"] = [{**good, "version": part}]
    with pytest.raises(ValidationError):  # what a device parses off its desired topic
        DesiredState.model_validate_json(json.dumps(raw))


def test_a_v2_case_names_its_track_and_tiles_and_a_v1_case_still_parses():
    # given a v1 case as an old device sends it (no track, no tiles)
    old = {
        "schema": "ef.escalation/1",
        "device_id": "cam-01",
        "ts": "2026-01-01T00:00:00Z",
        "case_id": "case-0001",
        "stream_id": "gate",
        "frame_index": 42,
        "reason": "unsure",
        "edge_result": [{"text": "AB12", "score": 0.41}],
        "model": {"name": "ppocr", "version": "4.0"},
        "content_type": "image/jpeg",
    }
    # then it parses as it did, with no track
    case = EscalationCase.model_validate_json(json.dumps(old))
    assert case.schema_id == "ef.escalation/1" and case.track_id is None and case.tiles == []
    # and a v2 case carries its track and the tiles of its image
    tile = Tile(x=0, y=0, w=80, h=20, frame_index=40, crop=(10, 10, 90, 30))
    new = EscalationCase.model_validate_json(
        json.dumps(
            {**old, "schema": "ef.escalation/2", "track_id": "gate-7", "tiles": [tile.model_dump()]}
        )
    )
    assert new.track_id == "gate-7" and new.tiles == [tile]
    # but a v1 case cannot claim v2 fields, nor a v1 verdict the cloud's lag
    with pytest.raises(ValidationError, match=r"ef\.escalation/2"):
        EscalationCase.model_validate_json(json.dumps({**old, "track_id": "gate-7"}))
    with pytest.raises(ValidationError, match=r"ef\.verdict/2"):
        CloudVerdict(
            schema="ef.verdict/1",
            device_id="cam-01",
            trace_id="0" * 32,
            case_id="case-0001",
            result=[],
            model="m",
            route="r",
            fallback_level=0,
            latency_ms=1.0,
            queue_depth=3,
        )


def test_a_verdict_notes_unread_lines_only_when_there_are_some():
    fields = dict(
        device_id="cam-01",
        trace_id="0" * 32,
        case_id="case-0001",
        result=[],
        model="ppocr6-cloud@6.0",
        route="default",
        fallback_level=0,
        latency_ms=1.0,
    )
    # given a verdict read whole: the wire has no new key (earlier devices parse it)
    whole = json.loads(CloudVerdict(**fields).model_dump_json())
    assert "lines_unread" not in whole
    # and a partial one says how many lines were left, and parses back
    partial = CloudVerdict(**fields, lines_unread=71)
    assert CloudVerdict.model_validate_json(partial.model_dump_json()).lines_unread == 71
    # and a v1 verdict cannot carry it
    with pytest.raises(ValidationError, match=r"ef\.verdict/2"):
        CloudVerdict(**fields, schema="ef.verdict/1", lines_unread=3)
