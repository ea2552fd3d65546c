"""The fast PUBLISH property decoder gives paho's result, and paho's refusal, on the same
bytes: every property a PUBLISH may carry, several user properties, non-ASCII text, and
malformed or forbidden input."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paho.mqtt import _packet
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import MQTTException, Properties, VariableByteIntegers

from edgefleet.shared.publish_properties import PublishProperties, install

PAYLOAD = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


def packed(**values: object) -> bytes:
    props = Properties(PacketTypes.PUBLISH)
    for name, value in values.items():
        setattr(props, name, value)
    return bytes(props.pack()) + PAYLOAD


def both(buffer: bytes) -> tuple[object, object]:
    """What paho and ours make of `buffer`: (json, length used), or "refused"."""
    out: list[object] = []
    for cls in (Properties, PublishProperties):
        props = cls(PacketTypes.PUBLISH)
        try:
            _, used = props.unpack(buffer)
            out.append((props.json(), used))
        except (MQTTException, struct.error, IndexError, KeyError, UnicodeDecodeError):
            out.append("refused")
    return out[0], out[1]


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"UserProperty": [("ef-schema", "ef.telemetry/1"), ("ef-sig", "ab" * 32)]},
        {
            "ContentType": "image/jpeg",
            "UserProperty": [("ef-meta", '{"text": "Grüße 東京 🚚"}'), ("ef-meta", "twice")],
        },
        {
            "PayloadFormatIndicator": 1,
            "MessageExpiryInterval": 3600,
            "ContentType": "application/json",
            "ResponseTopic": "ef/v1/cam-01/results",
            "CorrelationData": b"\x00\x01corr",
            "TopicAlias": 7,
            "UserProperty": [("", "")],
        },
    ],
)
def test_same_properties_and_length_as_paho(values: dict[str, object]) -> None:
    buffer = packed(**values)
    theirs, ours = both(buffer)
    assert ours == theirs
    assert isinstance(ours, tuple) and ours[1] == len(buffer) - len(PAYLOAD)


def test_subscription_identifiers_accumulate_like_paho() -> None:
    # two Subscription Identifier properties (id 11), as a broker sends for overlapping subs
    body = (
        bytes([11])
        + VariableByteIntegers.encode(5)
        + bytes([11])
        + VariableByteIntegers.encode(300)
    )
    buffer = bytes(VariableByteIntegers.encode(len(body))) + body + PAYLOAD
    theirs, ours = both(buffer)
    assert ours == theirs and ours[0] == {"SubscriptionIdentifier": [5, 300]}  # type: ignore[index]


def _raw(*props: bytes) -> bytes:
    body = b"".join(props)
    return bytes(VariableByteIntegers.encode(len(body))) + body + PAYLOAD


def _utf8(identifier: int, data: bytes) -> bytes:
    return bytes([identifier]) + struct.pack("!H", len(data)) + data


@pytest.mark.parametrize(
    "buffer",
    [
        _raw(_utf8(3, b"image/png\x00")),  # NUL in a string
        _raw(_utf8(3, "\ufeffx".encode())),  # byte order mark
        # a byte order mark in a user property value: the one-message outage of #32
        _raw(bytes([38]) + struct.pack("!H", 1) + b"x" + struct.pack("!H", 3) + "\ufeff".encode()),
        _raw(_utf8(3, b"\xff\xfe")),  # not UTF-8
        _raw(bytes([3, 0, 200]) + b"short"),  # string longer than the properties
        _raw(_utf8(3, b"a"), _utf8(3, b"b")),  # content type twice
        _raw(bytes([1, 2])),  # payload format indicator 2
        _raw(bytes([35, 0, 0])),  # topic alias 0
        _raw(bytes([17, 0, 0, 0, 1])),  # session expiry: not a PUBLISH property
        _raw(bytes([99, 0])),  # no such property
    ],
)
def test_what_paho_refuses_is_settled_with_a_reason_not_raised(buffer: bytes) -> None:
    # paho raises here, which drops the connection and makes the broker send it again
    theirs, _ = both(buffer)
    assert theirs == "refused", "paho accepted it: the case tests nothing"
    props = PublishProperties(PacketTypes.PUBLISH)
    _, used = props.unpack(buffer)
    assert used == len(buffer) - len(PAYLOAD)  # the payload still starts where it should
    assert props.refusal
    assert props.json() == {}  # nothing of a refused block is taken


def test_a_properties_length_past_the_packet_still_raises() -> None:
    # a frame no broker forwards: nothing after it can be read
    with pytest.raises(MQTTException):
        PublishProperties(PacketTypes.PUBLISH).unpack(bytes(VariableByteIntegers.encode(50)) + b"x")


text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\ufeff"))


@settings(max_examples=200, deadline=None)
@given(
    pairs=st.lists(st.tuples(text, text), max_size=5),
    content_type=st.none() | text,
    expiry=st.none() | st.integers(0, 2**32 - 1),
)
def test_any_valid_publish_properties_decode_as_paho_does(
    pairs: list[tuple[str, str]], content_type: str | None, expiry: int | None
) -> None:
    values: dict[str, object] = {}
    if pairs:
        values["UserProperty"] = pairs
    if content_type is not None:
        values["ContentType"] = content_type
    if expiry is not None:
        values["MessageExpiryInterval"] = expiry
    theirs, ours = both(packed(**values))
    assert ours == theirs


def test_install_puts_it_in_pahos_publish_decoder() -> None:
    assert install() is True
    assert install() is True  # idempotent
    header = 0x30 | (1 << 1)  # PUBLISH, QoS 1
    topic = b"ef/v1/cam-01/telemetry"
    body = struct.pack("!H", len(topic)) + topic + struct.pack("!H", 7)
    props = packed(UserProperty=[("ef-schema", "ef.telemetry/1")])
    result = _packet.decode_publish(header, body + props, 5)
    assert isinstance(result.properties, PublishProperties)
    assert result.properties.UserProperty == [("ef-schema", "ef.telemetry/1")]
    assert result.payload == PAYLOAD and result.mid == 7


def test_the_bench_decodes_the_edges_messages_alike_both_ways() -> None:
    from typer.testing import CliRunner

    from edgefleet.bench.bench_mqtt_properties import app

    result = CliRunner().invoke(app, ["--messages", "20", "--rounds", "1"])
    assert result.exit_code == 0, result.output
    rows = [
        line for line in result.output.splitlines() if line.startswith(("| telemetry", "| case"))
    ]
    assert len(rows) == 2 and all(row.endswith("| yes |") for row in rows), result.output
