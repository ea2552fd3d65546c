"""MQTT 5 PUBLISH properties decoded at a fraction of paho's cost, with the same result.

Every message a cloud replica receives has its properties built by paho
(`paho.mqtt.properties.Properties`): per message it rebuilds its name and type tables,
copies the rest of the packet (image included) once per property, runs a Python loop over
every character of every string, and sets each attribute through a `__setattr__` that
scans its tables again. `PublishProperties` is a `Properties` whose tables are built once
per process and whose `unpack` reads PUBLISH properties by offset, checks strings with one
regular expression, and applies the same rules (MQTT 5 section 2.2.2, the checks of paho's
`readUTF`); other packet types go to paho's own code. `edgefleet bench mqtt-properties`
decodes the same messages both ways.

Where paho raises on a value that breaks those rules (a byte order mark in a user
property, which brokers forward), `PublishProperties` records the reason in `refusal`
and lets the message through without properties, so that one client's message cannot
drop the connection of the one who receives it (see `unpack`).

`install()` makes paho's PUBLISH decoder (`paho.mqtt._packet.decode_publish`) use it.
That is a private module of paho (new in 2.2, the versions pyproject.toml allows), so
`install` checks what it replaces and leaves paho alone (returning False) if it is not
what it expects. The unit tests decode the same packets both ways and compare.
"""

from __future__ import annotations

import re
import struct
from typing import Any

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import MalformedPacket, MQTTException, Properties, VariableByteIntegers

_TABLES = Properties(PacketTypes.PUBLISH)  # paho's tables, built once

# id -> (attribute, kind) of the properties a PUBLISH may carry
_PUBLISH: dict[int, tuple[str, str]] = {
    1: ("PayloadFormatIndicator", "byte"),
    2: ("MessageExpiryInterval", "int32"),
    3: ("ContentType", "utf8"),
    8: ("ResponseTopic", "utf8"),
    9: ("CorrelationData", "binary"),
    11: ("SubscriptionIdentifier", "vbi"),
    35: ("TopicAlias", "int16"),
    38: ("UserProperty", "pair"),
}
_MULTIPLE = {"SubscriptionIdentifier", "UserProperty"}
# what paho's readUTF refuses: surrogates, NUL, the byte order mark (MQTT-1.5.4-1..3)
_BAD_CHAR = re.compile("[\ud800-\udfff\x00\ufeff]")
_INT16 = struct.Struct("!H")
_INT32 = struct.Struct("!L")


class PublishProperties(Properties):
    """paho's `Properties`, with its tables shared and a fast `unpack` for PUBLISH."""

    refusal: str | None = None  # why the received properties broke a rule, if they did

    def __init__(self, packetType: int):
        object.__setattr__(self, "packetType", packetType)
        object.__setattr__(self, "types", _TABLES.types)
        object.__setattr__(self, "names", _TABLES.names)
        object.__setattr__(self, "properties", _TABLES.properties)

    def unpack(self, buffer: Any) -> tuple[Properties, int]:
        """PUBLISH properties; a value that breaks a rule is recorded in `refusal`, not raised.

        paho raises on such a value and drops the connection; the broker then sends the
        same message again, for ever, and every other message behind it waits. Since the
        properties' length frames them, the packet stays readable: the message comes
        through with no properties and the reason, for its consumer to refuse and settle.
        Only a length that runs past the packet (which a broker never forwards) raises.
        """
        if self.packetType != PacketTypes.PUBLISH:
            return super().unpack(buffer)
        data = memoryview(buffer)
        propslen, start = VariableByteIntegers.decode(data[:4])
        end = start + propslen
        if end > len(data):
            raise MalformedPacket("properties longer than the packet")
        try:
            found = _publish_properties(data, start, end)
        except (MQTTException, UnicodeDecodeError, struct.error, IndexError) as exc:
            object.__setattr__(self, "refusal", str(exc) or type(exc).__name__)
            return self, end
        for name, value in found.items():
            object.__setattr__(self, name, value)
        return self, end


def _publish_properties(data: memoryview, start: int, end: int) -> dict[str, Any]:
    """The PUBLISH properties between `start` and `end`, by the rules of MQTT 5 2.2.2."""
    found: dict[str, Any] = {}
    pos = start
    while pos < end:
        identifier, used = VariableByteIntegers.decode(data[pos : min(pos + 4, end)])
        spec = _PUBLISH.get(identifier)
        if spec is None:
            raise MalformedPacket(f"property {identifier} is not a PUBLISH property")
        pos += used
        name, kind = spec
        value, pos = _read(data, pos, end, kind)
        if name in _MULTIPLE:
            found.setdefault(name, []).append(value)
        elif name in found:
            raise MQTTException(f"Property '{name}' must not exist more than once")
        else:
            _check_range(name, value)
            found[name] = value
    return found


def _read(data: memoryview, pos: int, end: int, kind: str) -> tuple[Any, int]:
    """One value of `kind` at `pos`; (value, position after it)."""
    if kind == "byte":
        _need(pos + 1, end)
        return data[pos], pos + 1
    if kind == "int16":
        _need(pos + 2, end)
        return _INT16.unpack_from(data, pos)[0], pos + 2
    if kind == "int32":
        _need(pos + 4, end)
        return _INT32.unpack_from(data, pos)[0], pos + 4
    if kind == "vbi":
        value, used = VariableByteIntegers.decode(data[pos : min(pos + 4, end)])
        return value, pos + used
    if kind == "binary":
        length, pos = _length(data, pos, end)
        return bytes(data[pos : pos + length]), pos + length
    if kind == "utf8":
        return _utf8(data, pos, end)
    first, pos = _utf8(data, pos, end)
    second, pos = _utf8(data, pos, end)
    return (first, second), pos


def _utf8(data: memoryview, pos: int, end: int) -> tuple[str, int]:
    length, pos = _length(data, pos, end)
    text = str(data[pos : pos + length], "utf-8")
    if _BAD_CHAR.search(text):
        raise MalformedPacket("[MQTT-1.5.4] invalid character in UTF-8 data")
    return text, pos + length


def _length(data: memoryview, pos: int, end: int) -> tuple[int, int]:
    if end - pos < 2:
        raise MalformedPacket("Not enough data to read string length")
    length = _INT16.unpack_from(data, pos)[0]
    if length > end - pos - 2:
        raise MalformedPacket("Length delimited string too long")
    return length, pos + 2


def _need(upto: int, end: int) -> None:
    if upto > end:
        raise MalformedPacket("property value runs past the properties")


def _check_range(name: str, value: int | str | bytes) -> None:
    """The value checks of paho's `Properties.__setattr__` that PUBLISH properties have."""
    if name == "TopicAlias" and not 1 <= int(value) <= 65535:
        raise MQTTException(f"{name} property value must be in the range 1-65535")
    if name == "PayloadFormatIndicator" and value not in (0, 1):
        raise MQTTException(f"{name} property value must be 0 or 1")


def install() -> bool:
    """Make paho decode received PUBLISH properties with `PublishProperties` (idempotent).

    False (and paho untouched) when paho's private decoder is not the one this was
    written against.
    """
    try:
        from paho.mqtt import _packet
    except ImportError:
        return False
    current = getattr(_packet, "Properties", None)
    if current is PublishProperties:
        return True
    if current is not Properties or not callable(getattr(_packet, "decode_publish", None)):
        return False
    _packet.Properties = PublishProperties  # type: ignore[misc]
    return True
