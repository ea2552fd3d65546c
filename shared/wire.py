"""Wire format v1: how a message model becomes MQTT 5 bytes and properties, and back.

Pinned so that any MQTT 5 client can speak it:
- JSON messages: the payload is the UTF-8 JSON of the model.
- EscalationCase: the payload is the raw image; its metadata JSON is the `ef-meta` user
  property, and the content-type property names the image type.
- Every message has `ef-schema` and `ef-sig` = hex HMAC-SHA256(device key,
  meta_bytes + b"\\n" + payload_bytes), meta_bytes being empty for JSON messages.
"""

from __future__ import annotations

import functools
import hmac
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from prometheus_client import Counter
from pydantic import ValidationError

from edgefleet.shared.bounded import ENTRY_OVERHEAD, BoundedMap
from edgefleet.shared.errors import PayloadRejected
from edgefleet.shared.hashing import same_hex
from edgefleet.shared.logs import clip
from edgefleet.shared.messages import (
    MESSAGE_TYPES,
    DeviceStatus,
    DeviceTelemetry,
    EscalationCase,
    ImageContentType,
    Message,
)
from edgefleet.shared.topics import CHANNEL_SCHEMA, Topics

SCHEMA_PROP = "ef-schema"
SIG_PROP = "ef-sig"
META_PROP = "ef-meta"

IMAGE_MAGIC = {"image/jpeg": b"\xff\xd8\xff", "image/png": b"\x89PNG\r\n\x1a\n"}

REJECTED = Counter(
    "ef_messages_rejected_total", "Messages rejected by the wire verifier", ["reason"]
)
ACCEPTED = Counter("ef_messages_accepted_total", "Messages that passed verification", ["schema"])


def signature(key: bytes, meta: bytes, payload: bytes) -> str:
    return hmac.digest(key, meta + b"\n" + payload, "sha256").hex()  # C one-shot: fast path


@dataclass(frozen=True)
class WireMessage:
    """What goes on (or came off) the broker: topic, payload bytes, MQTT 5 properties."""

    topic: str
    payload: bytes
    user_properties: tuple[tuple[str, str], ...]
    content_type: str | None = None
    retained: bool = False  # received from the broker's retained store
    refusal: str | None = None  # why the MQTT decoder refused its properties, if it did

    def prop(self, name: str) -> str | None:
        return next((v for k, v in self.user_properties if k == name), None)


# An MQTT user property holds at most 65,535 bytes; the metadata of a case must fit in one.
MAX_META_BYTES = 60_000


def fit_meta(case: EscalationCase) -> tuple[EscalationCase, bytes]:
    """The case and its `ef-meta` bytes, within MAX_META_BYTES.

    A case whose edge result is too large to travel (hundreds of OCR lines) keeps the
    lines the edge was least sure of, which are what the cloud is asked about; without
    this it could never leave the outbox.
    """
    meta = case.model_dump_json().encode()
    if len(meta) <= MAX_META_BYTES:
        return case, meta
    ranked = sorted(case.edge_result, key=lambda d: d.score)
    keep_lo, keep_hi = 0, len(ranked)  # the largest count that fits is in [lo, hi)
    while keep_hi - keep_lo > 1:
        mid = (keep_lo + keep_hi) // 2
        trial = case.model_copy(update={"edge_result": ranked[:mid]})
        if len(trial.model_dump_json().encode()) <= MAX_META_BYTES:
            keep_lo = mid
        else:
            keep_hi = mid
    fitted = case.model_copy(update={"edge_result": ranked[:keep_lo]})
    return fitted, fitted.model_dump_json().encode()


@dataclass(frozen=True)
class Serialised:
    """A message serialised once: its schema id, its JSON and, for a case, the image beside it.

    What the edge's outbox stores and the uplink signs as read, so a message is laid out
    once on its way out however long it waits.
    """

    schema_id: str
    json: bytes
    image: bytes | None = None
    content_type: ImageContentType | None = None


def serialise(message: Message, image: bytes | None = None) -> Serialised:
    """The one serialisation of `message` (a case must come with its image, nothing else may)."""
    if isinstance(message, EscalationCase):
        if not image:
            raise ValueError("an EscalationCase travels with its image bytes")
        return Serialised(
            message.schema_id, message.model_dump_json().encode(), image, message.content_type
        )
    if image is not None:
        raise ValueError(f"{message.schema_id} carries no image")
    return Serialised(message.schema_id, message.model_dump_json().encode())


def serialise_case(case: EscalationCase, image: bytes) -> tuple[EscalationCase, Serialised]:
    """The case as it will travel (trimmed by `fit_meta` if need be) and its serialisation."""
    if not image:
        raise ValueError("an EscalationCase travels with its image bytes")
    fitted, meta = fit_meta(case)
    return fitted, Serialised(fitted.schema_id, meta, image, fitted.content_type)


def sign(message: Serialised, key: bytes, topic: str) -> WireMessage:
    """Sign and lay out a serialised message for `topic` per wire format v1."""
    if message.image is not None:
        meta, payload = message.json, message.image
        props = [(SCHEMA_PROP, message.schema_id), (META_PROP, meta.decode())]
        content_type: str | None = message.content_type
    else:
        meta, payload = b"", message.json
        props = [(SCHEMA_PROP, message.schema_id)]
        content_type = "application/json"
    props.append((SIG_PROP, signature(key, meta, payload)))
    return WireMessage(topic, payload, tuple(props), content_type)


def encode(message: Message, key: bytes, topic: str, image: bytes | None = None) -> WireMessage:
    """Sign and lay out one message for `topic` per wire format v1."""
    return sign(serialise(message, image), key, topic)


@dataclass(frozen=True)
class Verified:
    message: Message
    image: bytes | None
    device_id: str
    # a case's ef-meta exactly as signed and parsed: stored as is, never serialised again
    meta: bytes = b""
    # the message as it came, signature and all: what a desired state's image is handed
    # to the host updater as, so the updater checks the fleet's signature itself
    wire: WireMessage | None = None


class ReplayGuard:
    """Remembers (device, kind, key) seen within a window, bounded by count and bytes.

    The window only needs to cover the time a message passes the staleness check (twice
    the allowed clock skew); past the bounds the oldest go first, counted as `full`
    evictions (`ef_bounded_evictions_total{name="wire_replay"}`): a replay of those is
    then let through, which the stores' idempotency (case_id) still absorbs.
    """

    def __init__(
        self,
        window_s: float = 900.0,
        max_entries: int = 1_000_000,
        max_bytes: int = 256 * 2**20,
        *,
        name: str = "wire_replay",
        clock: Callable[[], float] = time.monotonic,
    ):
        self._seen: BoundedMap[str, bool] = BoundedMap(
            name,
            max_entries=max_entries,
            max_bytes=max_bytes,
            size_of=lambda key, _: sys.getsizeof(key) + ENTRY_OVERHEAD,
            ttl_s=window_s,
            clock=clock,
        )

    def check_and_add(self, device_id: str, kind: str, key: str) -> bool:
        """True if new; False if this key was seen inside the window."""
        return self._seen.add_if_absent(f"{device_id}\0{kind}\0{key}", True)

    def __len__(self) -> int:
        return len(self._seen)


class ReplayedMessage(PayloadRejected):
    """A correctly signed message whose case_id/seq was already seen.

    It carries the verified message, so an idempotent consumer can answer it from its
    store instead of running it again.
    """

    def __init__(self, verified: Verified, message: str):
        super().__init__("replayed", message)
        self.verified = verified


@dataclass
class Verifier:
    """Checks every incoming message and counts each rejection by reason."""

    key_for_device: Callable[[str], bytes | None]
    topics: Topics = field(default_factory=Topics)
    max_payload_bytes: int = 8 * 1024 * 1024
    max_meta_bytes: int = MAX_META_BYTES
    max_skew_s: float = 300.0
    replay_guard: ReplayGuard = field(default_factory=ReplayGuard)

    def verify(self, wire: WireMessage, *, now: datetime | None = None) -> Verified:
        try:
            verified = self._verify(wire, now or datetime.now(timezone.utc))
        except PayloadRejected as exc:
            REJECTED.labels(exc.reason).inc()
            raise
        _accepted(verified.message.schema_id).inc()
        return verified

    def _verify(self, wire: WireMessage, now: datetime) -> Verified:
        device_id, channel = self.topics.parse(wire.topic)
        if wire.refusal:
            raise PayloadRejected("malformed", f"MQTT properties refused: {clip(wire.refusal)}")
        if len(wire.payload) > self.max_payload_bytes:
            raise PayloadRejected(
                "oversize", f"payload of {len(wire.payload)} bytes > {self.max_payload_bytes}"
            )
        schema_id = wire.prop(SCHEMA_PROP)
        model = MESSAGE_TYPES.get(schema_id or "")
        if model is None or schema_id not in CHANNEL_SCHEMA.get(channel, ()):
            shown = clip(repr(schema_id), 80)
            raise PayloadRejected("schema", f"schema {shown} not accepted on {channel.value}")
        sig = wire.prop(SIG_PROP)
        if not sig:
            raise PayloadRejected("unsigned", "message has no ef-sig user property")
        key = self.key_for_device(device_id)
        if key is None:
            raise PayloadRejected("unknown_device", f"device {device_id!r} is not enrolled")
        meta_text = wire.prop(META_PROP) if model is EscalationCase else None
        meta = (meta_text or "").encode()
        if len(meta) > self.max_meta_bytes:
            raise PayloadRejected("oversize", f"ef-meta of {len(meta)} bytes is too large")
        if not same_hex(sig, signature(key, meta, wire.payload)):
            raise PayloadRejected("bad_signature", "ef-sig does not match the message")
        message = self._parse(model, meta if model is EscalationCase else wire.payload)
        if message.device_id != device_id:
            raise PayloadRejected(
                "device_mismatch", f"device_id {message.device_id!r} published on {wire.topic!r}"
            )
        skew = abs((now - message.ts).total_seconds())
        if skew > self.max_skew_s and not _is_last_will(message):
            raise PayloadRejected("stale", f"ts is {skew:.0f} s from now (> {self.max_skew_s:.0f})")
        image = None
        if isinstance(message, EscalationCase):
            image = wire.payload
            if wire.content_type and wire.content_type != message.content_type:
                raise PayloadRejected(
                    "content_type",
                    f"content-type {wire.content_type!r} but ef-meta says {message.content_type!r}",
                )
            if not image.startswith(IMAGE_MAGIC[message.content_type]):
                raise PayloadRejected("content_type", f"payload is not {message.content_type}")
        verified = Verified(message, image, device_id, meta, wire)
        replay_key = _replay_key(message)
        if replay_key and not self.replay_guard.check_and_add(device_id, *replay_key):
            raise ReplayedMessage(verified, f"{replay_key[0]} {replay_key[1]!r} already seen")
        return verified

    @staticmethod
    def _parse(model: type[Message], raw: bytes) -> Message:
        try:
            return model.model_validate_json(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "<root>"
            raise PayloadRejected("invalid", f"{where}: {first['msg']}") from None


@functools.cache
def _accepted(schema_id: str) -> Any:
    """The counter child of one schema (label lookups cost more than the count itself)."""
    return ACCEPTED.labels(schema_id)


def _is_last_will(message: Message) -> bool:
    """An `offline` status is accepted at any age: it is the device's MQTT last will, signed
    when the agent connected and published by the broker whenever the link dies, so its
    `ts` is the connection's start, not the news. Taking it for what it is (rather than
    refreshing the will, which MQTT allows only by reconnecting) is safe: it carries no
    data, only the broker and the device's own credentials may publish on its status
    topic, and a replay of it is undone by the device's next telemetry."""
    return isinstance(message, DeviceStatus) and message.state == "offline"


def _replay_key(message: Message) -> tuple[str, str] | None:
    if isinstance(message, EscalationCase):
        return ("case_id", message.case_id)
    if isinstance(message, DeviceTelemetry):
        return ("seq", str(message.seq))
    return None
