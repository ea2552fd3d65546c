"""Wire format v1: signing, layout and every rejection reason of the verifier."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import datetime, timedelta, timezone

import pytest

from edgefleet.shared.errors import PayloadRejected
from edgefleet.shared.messages import (
    DeviceStatus,
    DeviceTelemetry,
    EscalationCase,
    EscalationCounters,
    ModelInfo,
)
from edgefleet.shared.topics import Topics
from edgefleet.shared.wire import (
    META_PROP,
    REJECTED,
    SCHEMA_PROP,
    SIG_PROP,
    ReplayedMessage,
    Verifier,
    WireMessage,
    encode,
)

KEY = b"k" * 32
TOPICS = Topics()
JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 64 + b"\xff\xd9"


def verifier(**kwargs) -> Verifier:
    return Verifier(key_for_device=lambda d: KEY if d == "cam-01" else None, **kwargs)


def telemetry(seq: int = 1, device_id: str = "cam-01", **kw) -> DeviceTelemetry:
    return DeviceTelemetry(
        device_id=device_id,
        seq=seq,
        uptime_s=1.0,
        escalations=EscalationCounters(sent=0, pending=0, dropped=0),
        outbox_depth=0,
        cpu_pct=1.0,
        ram_used_mb=1.0,
        **kw,
    )


def case(**kw) -> EscalationCase:
    return EscalationCase(
        device_id="cam-01",
        stream_id="s1",
        frame_index=1,
        reason="unsure",
        model=ModelInfo(name="ppocr", version="4"),
        content_type="image/jpeg",
        **kw,
    )


def rejected_count(reason: str) -> float:
    return REJECTED.labels(reason)._value.get()


def test_json_message_signature_is_hmac_of_newline_and_payload():
    wire = encode(telemetry(), KEY, TOPICS.telemetry("cam-01"))
    expected = hmac.new(KEY, b"\n" + wire.payload, hashlib.sha256).hexdigest()
    assert wire.prop(SIG_PROP) == expected
    assert wire.prop(SCHEMA_PROP) == "ef.telemetry/1"
    assert wire.prop(META_PROP) is None
    assert json.loads(wire.payload)["seq"] == 1


def test_escalation_carries_raw_image_and_meta_in_user_property():
    message = case()
    wire = encode(message, KEY, TOPICS.escalations("cam-01"), image=JPEG)
    assert wire.payload == JPEG
    assert wire.content_type == "image/jpeg"
    meta = wire.prop(META_PROP).encode()
    assert wire.prop(SIG_PROP) == hmac.new(KEY, meta + b"\n" + JPEG, hashlib.sha256).hexdigest()
    verified = verifier().verify(wire)
    assert verified.message == message and verified.image == JPEG


def test_escalation_without_image_cannot_be_encoded():
    with pytest.raises(ValueError):
        encode(case(), KEY, TOPICS.escalations("cam-01"))


def _tamper(wire: WireMessage, **changes) -> WireMessage:
    props = dict(wire.user_properties)
    props.update(changes.pop("props", {}))
    for name in changes.pop("drop", ()):
        props.pop(name)
    return WireMessage(
        changes.get("topic", wire.topic),
        changes.get("payload", wire.payload),
        tuple(props.items()),
        wire.content_type,
    )


@pytest.mark.parametrize(
    "reason, make",
    [
        ("unsigned", lambda w: _tamper(w, drop=[SIG_PROP])),
        ("bad_signature", lambda w: _tamper(w, props={SIG_PROP: "0" * 64})),
        ("bad_signature", lambda w: _tamper(w, props={SIG_PROP: "é" * 64})),
        ("bad_signature", lambda w: _tamper(w, props={SIG_PROP: "\udcff" * 8})),
        ("bad_signature", lambda w: _tamper(w, payload=w.payload.replace(b'"seq":1', b'"seq":2'))),
        ("schema", lambda w: _tamper(w, props={SCHEMA_PROP: "ef.status/1"})),
        ("schema", lambda w: _tamper(w, drop=[SCHEMA_PROP])),
        ("schema", lambda w: _tamper(w, props={SCHEMA_PROP: "ef.telemetry/9"})),
        ("schema", lambda w: _tamper(w, props={SCHEMA_PROP: "ef.bogus/1"})),
        ("topic", lambda w: _tamper(w, topic="elsewhere/cam-01/telemetry")),
        ("unknown_device", lambda w: _tamper(w, topic="ef/v1/cam-99/telemetry")),
    ],
)
def test_tampered_messages_are_rejected_and_counted(reason, make):
    wire = make(encode(telemetry(seq=100), KEY, TOPICS.telemetry("cam-01")))
    before = rejected_count(reason)
    with pytest.raises(PayloadRejected) as err:
        verifier().verify(wire)
    assert err.value.reason == reason
    assert rejected_count(reason) == before + 1


def test_device_id_must_match_topic():
    # a device with a valid key publishing a message that claims another device's id
    keys = {"cam-01": KEY, "cam-02": b"x" * 32}
    wire = encode(telemetry(device_id="cam-02"), KEY, TOPICS.telemetry("cam-01"))
    with pytest.raises(PayloadRejected) as err:
        Verifier(key_for_device=keys.get).verify(wire)
    assert err.value.reason == "device_mismatch"


def test_stale_and_future_timestamps_are_rejected():
    now = datetime.now(timezone.utc)
    for ts in (now - timedelta(seconds=301), now + timedelta(seconds=301)):
        wire = encode(telemetry(seq=200, ts=ts), KEY, TOPICS.telemetry("cam-01"))
        with pytest.raises(PayloadRejected) as err:
            verifier().verify(wire, now=now)
        assert err.value.reason == "stale"


def test_a_last_will_is_accepted_at_any_age_an_old_online_status_is_not():
    # the will is signed when the agent connects and sent by the broker when it dies
    now = datetime.now(timezone.utc)
    long_ago = now - timedelta(hours=5)
    will = DeviceStatus(device_id="cam-01", state="offline", agent_version="1", ts=long_ago)
    wire = encode(will, KEY, TOPICS.status("cam-01"))
    assert verifier().verify(wire, now=now).message == will
    online = will.model_copy(update={"state": "online"})
    with pytest.raises(PayloadRejected) as err:
        verifier().verify(encode(online, KEY, TOPICS.status("cam-01")), now=now)
    assert err.value.reason == "stale"


def test_timestamps_within_the_300_s_window_are_accepted():
    now = datetime.now(timezone.utc)
    v = verifier()
    for seq, ts in enumerate((now - timedelta(seconds=299), now + timedelta(seconds=299))):
        wire = encode(telemetry(seq=300 + seq, ts=ts), KEY, TOPICS.telemetry("cam-01"))
        assert v.verify(wire, now=now).message.ts == ts


def test_replayed_seq_and_case_id_are_rejected_with_the_verified_message():
    v = verifier()
    wire = encode(telemetry(seq=5), KEY, TOPICS.telemetry("cam-01"))
    v.verify(wire)
    with pytest.raises(ReplayedMessage) as err:
        v.verify(wire)
    assert err.value.reason == "replayed"

    message = case()
    esc = encode(message, KEY, TOPICS.escalations("cam-01"), image=JPEG)
    v.verify(esc)
    with pytest.raises(ReplayedMessage) as err:
        v.verify(esc)
    # an idempotent consumer can answer the duplicate from its store
    assert err.value.verified.message.case_id == message.case_id


def test_oversize_payload_and_meta_are_rejected():
    wire = encode(case(), KEY, TOPICS.escalations("cam-01"), image=JPEG + b"\x00" * 2000)
    with pytest.raises(PayloadRejected) as err:
        verifier(max_payload_bytes=1000).verify(wire)
    assert err.value.reason == "oversize"
    with pytest.raises(PayloadRejected) as err:
        verifier(max_meta_bytes=10).verify(wire)
    assert err.value.reason == "oversize"


def test_a_case_too_large_for_one_user_property_is_trimmed_to_its_least_sure_lines():
    from edgefleet.shared.messages import Detection
    from edgefleet.shared.wire import MAX_META_BYTES, fit_meta

    lines = [
        Detection(label=f"line {i:03d} " + "x" * 120, score=0.5 + (i % 50) / 100, box=(0, 0, 9, 9))
        for i in range(600)
    ]
    big = case().model_copy(update={"edge_result": lines})
    assert len(big.model_dump_json().encode()) > 65_535  # would never leave the outbox
    fitted, meta = fit_meta(big)
    assert len(meta) <= MAX_META_BYTES and 0 < len(fitted.edge_result) < 600
    kept = max(d.score for d in fitted.edge_result)
    assert all(d.score >= kept for d in lines if d not in fitted.edge_result)
    # and the trimmed case is what gets signed and verified
    wire = encode(fitted, KEY, TOPICS.escalations("cam-01"), image=JPEG)
    assert verifier().verify(wire).message.case_id == big.case_id
    small = case()
    assert fit_meta(small) == (small, small.model_dump_json().encode())


def test_image_that_lies_about_its_type_is_rejected():
    wire = encode(case(), KEY, TOPICS.escalations("cam-01"), image=b"GIF89a not a jpeg")
    with pytest.raises(PayloadRejected) as err:
        verifier().verify(wire)
    assert err.value.reason == "content_type"


def test_content_type_property_must_agree_with_the_metadata():
    # given a JPEG case whose MQTT content-type property claims PNG
    wire = encode(case(), KEY, TOPICS.escalations("cam-01"), image=JPEG)
    lying = WireMessage(wire.topic, wire.payload, wire.user_properties, "image/png")
    # then it is rejected and counted, while a client that sets no content type is accepted
    before = rejected_count("content_type")
    with pytest.raises(PayloadRejected) as err:
        verifier().verify(lying)
    assert err.value.reason == "content_type"
    assert rejected_count("content_type") == before + 1
    unset = WireMessage(wire.topic, wire.payload, wire.user_properties, None)
    assert verifier().verify(unset).image == JPEG


def test_signed_but_invalid_document_is_rejected_as_invalid():
    payload = b'{"schema":"ef.status/1","device_id":"cam-01","state":"sleepy"}'
    sig = hmac.new(KEY, b"\n" + payload, hashlib.sha256).hexdigest()
    wire = WireMessage(
        TOPICS.status("cam-01"), payload, ((SCHEMA_PROP, "ef.status/1"), (SIG_PROP, sig))
    )
    with pytest.raises(PayloadRejected) as err:
        verifier().verify(wire)
    assert err.value.reason == "invalid"


def test_status_messages_have_no_replay_key():
    v = verifier()
    wire = encode(
        DeviceStatus(device_id="cam-01", state="online", agent_version="1"),
        KEY,
        TOPICS.status("cam-01"),
    )
    v.verify(wire)
    v.verify(wire)  # a retained status re-delivered on every subscribe is not a replay


def test_a_message_serialised_once_signs_to_the_same_wire_message_as_encode():
    from edgefleet.shared.wire import Serialised, serialise, serialise_case, sign

    # given a case and a telemetry message
    the_case, the_telemetry = case(), telemetry()
    # when each is serialised once and its stored bytes are signed
    fitted, stored_case = serialise_case(the_case, JPEG)
    stored_telemetry = serialise(the_telemetry)
    # then the wire messages are those of the one-step encode, and the case is unchanged
    assert fitted == the_case
    assert stored_case == Serialised(
        "ef.escalation/2", the_case.model_dump_json().encode(), JPEG, "image/jpeg"
    )
    topic = TOPICS.escalations("cam-01")
    assert sign(stored_case, KEY, topic) == encode(the_case, KEY, topic, image=JPEG)
    topic = TOPICS.telemetry("cam-01")
    assert sign(stored_telemetry, KEY, topic) == encode(the_telemetry, KEY, topic)
    # and a case never goes without its image, nor a JSON message with one
    with pytest.raises(ValueError):
        serialise(the_case)
    with pytest.raises(ValueError):
        serialise_case(the_case, b"")
    with pytest.raises(ValueError):
        serialise(the_telemetry, JPEG)


def test_every_outgoing_schema_has_one_channel():
    from edgefleet.shared.topics import Channel, channel_of

    assert channel_of("ef.escalation/1") is Channel.ESCALATIONS
    assert channel_of("ef.telemetry/1") is Channel.TELEMETRY
    assert channel_of("ef.reported/1") is Channel.REPORTED
    with pytest.raises(ValueError):
        channel_of("ef.nothing/1")
