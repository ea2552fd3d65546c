"""The one way both sides make an MQTT 5 client and move wire messages through paho."""

from __future__ import annotations

import logging
import random
import ssl
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from pydantic import Field

from edgefleet.shared import publish_properties
from edgefleet.shared.config import Closed
from edgefleet.shared.publish_properties import PublishProperties
from edgefleet.shared.topics import DEFAULT_ROOT
from edgefleet.shared.wire import WireMessage

log = logging.getLogger(__name__)


class MqttSettings(Closed):
    """The broker connection, the same for devices and the cloud."""

    host: str = Field("127.0.0.1", description="broker host")
    port: int = Field(1883, ge=1, le=65535, description="broker port")
    username: str | None = Field(None, description="broker username (device id for devices)")
    password: str | None = Field(None, description="broker password")
    tls_ca: Path | None = Field(None, description="CA file; enables TLS when set")
    tls_cert: Path | None = Field(None, description="client certificate for mutual TLS")
    tls_key: Path | None = Field(None, description="client key for mutual TLS")
    keepalive_s: int = Field(30, ge=5, description="MQTT keepalive")
    session_expiry_s: int = Field(
        7 * 24 * 3600, ge=0, description="persistent session lifetime after a disconnect"
    )
    max_inflight: int = Field(
        256, ge=1, description="QoS 1 messages in flight; paho's default of 20 starves slow links"
    )
    reconnect_min_s: float = Field(0.5, gt=0, description="first reconnect delay")
    reconnect_max_s: float = Field(30.0, gt=0, description="reconnect delay cap")
    topic_root: str = Field(DEFAULT_ROOT, description="topic root of the contract")


def device_client_id(device_id: str) -> str:
    """The one client id a device may connect with; the broker binds it to its username."""
    return f"ef-edge-{device_id}"


def make_client(
    settings: MqttSettings,
    client_id: str,
    *,
    will: WireMessage | None = None,
) -> mqtt.Client:
    """A paho MQTT 5 client, not yet connected: call `connect_async` + `loop_start`.

    Received PUBLISH properties are decoded by `publish_properties` (paho's result, a
    fraction of its CPU) wherever paho lets it in.
    """
    if not publish_properties.install():
        log.error(
            "paho's PUBLISH decoder is not the one edgefleet wraps: a message with a malformed"
            " property will drop this connection (install paho-mqtt 2.2)"
        )
    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=mqtt.MQTTv5,
        reconnect_on_failure=True,
    )
    if settings.username:
        client.username_pw_set(settings.username, settings.password)
    if settings.tls_ca:
        client.tls_set(
            ca_certs=str(settings.tls_ca),
            certfile=str(settings.tls_cert) if settings.tls_cert else None,
            keyfile=str(settings.tls_key) if settings.tls_key else None,
            tls_version=ssl.PROTOCOL_TLS_CLIENT,
        )
    client.max_inflight_messages_set(settings.max_inflight)
    client.max_queued_messages_set(0)
    # each client's backoff drawn once, up to a quarter off: clients dropped together by a
    # broker restart do not all come back in the same millisecond (seconds kept whole no more)
    jitter = random.uniform(0.75, 1.0)
    client.reconnect_delay_set(  # paho's hints say int; it only sleeps and doubles them
        min_delay=settings.reconnect_min_s * jitter,  # type: ignore[arg-type]
        max_delay=settings.reconnect_max_s * jitter,  # type: ignore[arg-type]
    )
    if will is not None:
        client.will_set(will.topic, will.payload, qos=1, retain=True, properties=properties(will))
    return client


def connect_properties(session_expiry_s: int, receive_maximum: int | None = None) -> Properties:
    """A CONNECT's properties: how long the broker keeps the session, and how many QoS 1
    messages it may have in flight to us (None: the broker's default)."""
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = session_expiry_s
    if receive_maximum is not None:
        props.ReceiveMaximum = receive_maximum
    return props


def connect(client: mqtt.Client, settings: MqttSettings, *, clean_start: bool = False) -> None:
    """Connect in the background; paho keeps reconnecting with backoff afterwards.

    Without `clean_start` the broker keeps the session (subscriptions and queued QoS 1
    messages) for `session_expiry_s`, so nothing addressed to us is lost while we are away.
    """
    props = connect_properties(0 if clean_start else settings.session_expiry_s)
    client.connect_async(
        settings.host,
        settings.port,
        keepalive=settings.keepalive_s,
        clean_start=clean_start,
        properties=props,
    )
    client.loop_start()


def properties(wire: WireMessage) -> Properties:
    props = PublishProperties(PacketTypes.PUBLISH)  # paho's tables, built once
    props.UserProperty = list(wire.user_properties)
    if wire.content_type:
        props.ContentType = wire.content_type
    return props


def publish(
    client: mqtt.Client, wire: WireMessage, *, qos: int = 1, retain: bool = False
) -> mqtt.MQTTMessageInfo:
    return client.publish(
        wire.topic, wire.payload, qos=qos, retain=retain, properties=properties(wire)
    )


def from_paho(message: mqtt.MQTTMessage) -> WireMessage:
    """Wire message of a received paho message (user properties and content type kept).

    A message whose properties the decoder refused, or whose topic is not UTF-8, comes
    back with the reason in `refusal`, for the verifier to reject: never an exception in
    paho's network thread.
    """
    props = getattr(message, "properties", None)
    refusal = getattr(props, "refusal", None)
    try:
        topic = message.topic
    except UnicodeDecodeError:
        topic, refusal = message._topic.decode("utf-8", "replace"), "topic is not UTF-8"
    user = tuple((str(k), str(v)) for k, v in (getattr(props, "UserProperty", None) or []))
    content_type = getattr(props, "ContentType", None)
    return WireMessage(
        topic, bytes(message.payload), user, content_type, retained=bool(message.retain),
        refusal=refusal,
    )
