"""MQTT ingest: subscriptions, verification, at-least-once into the store.

Replicas subscribe to `$share/<group>/ef/v1/+/{escalations,telemetry,status,reported}`,
so the broker hands each message to exactly one replica of the group; a single replica
subscribes plainly (`ingest.subscription`). Either way the session is persistent and
the subscriptions are never left on a stop: the broker keeps queueing what comes while
the replica restarts. Mosquitto 2.0 restores only plain subscriptions from its
persistence, so only a plain one also loses nothing across the broker's own restart; a
shared one is made again first thing on every connect. Messages are
acknowledged by hand (paho manual ack) only after they are stored (a case: after its
verdict is stored and the broker has taken the verdict for the device), and the CONNECT
property Receive Maximum caps how many the broker may have unacknowledged with us:
when we fall behind, the broker holds the rest (flow control instead of memory growth).

A replayed case (same case_id) is answered again from the store, never re-run.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from prometheus_client import Counter, Gauge

from edgefleet.cloud.acks import Acks
from edgefleet.cloud.light import LightSink
from edgefleet.cloud.processor import CaseProcessor
from edgefleet.cloud.registry import Registry
from edgefleet.shared.bounded import ENTRY_OVERHEAD, BoundedMap
from edgefleet.shared.errors import EdgefleetError, PayloadRejected
from edgefleet.shared.messages import (
    CloudVerdict,
    EscalationCase,
    ReportedState,
)
from edgefleet.shared.mqtt import (
    MqttSettings,
    connect_properties,
    from_paho,
)
from edgefleet.shared.topics import Channel, Topics
from edgefleet.shared.wire import (
    ReplayedMessage,
    ReplayGuard,
    Verified,
    Verifier,
    WireMessage,
)

log = logging.getLogger(__name__)

INGESTED = Counter(
    "ef_cloud_ingest_total",
    "MQTT messages taken in, by channel and outcome",
    ["channel", "outcome"],
)
BROKER_CONNECTED = Gauge("ef_cloud_broker_connected", "1 while the ingest client is connected")


@functools.cache
def _ingested(channel: str, outcome: str) -> Any:
    """The counter child of one (channel, outcome): looked up once, not per message."""
    return INGESTED.labels(channel, outcome)


CHANNELS = (Channel.ESCALATIONS, Channel.TELEMETRY, Channel.STATUS, Channel.REPORTED)


class Ingest:
    def __init__(
        self,
        mqtt_settings: MqttSettings,
        client: mqtt.Client,
        registry: Registry,
        processor: CaseProcessor,
        *,
        share_group: str | None,
        receive_maximum: int,
        light_queue: int = 10_000,
        light_queue_bytes: int = 64 * 2**20,
        light_workers: int = 2,
        batch_max: int = 500,
        light_flush_s: float = 0.02,
        client_id: str,
        session_expiry_s: int = 300,
        max_payload_bytes: int = 8 * 1024 * 1024,
        max_skew_s: float = 300.0,
        replay_max_entries: int = 1_000_000,
        replay_max_bytes: int = 256 * 2**20,
        on_reported: Callable[[ReportedState], None] | None = None,
    ):
        self.settings = mqtt_settings
        self.registry = registry
        self.processor = processor
        self.share_group = share_group
        self.receive_maximum = receive_maximum
        self.topics = Topics(mqtt_settings.topic_root)
        self.verifier = Verifier(
            key_for_device=registry.device_key,
            topics=self.topics,
            max_payload_bytes=max_payload_bytes,
            max_skew_s=max_skew_s,
            # a replay older than this fails the staleness check anyway
            replay_guard=ReplayGuard(
                window_s=2 * max_skew_s + 5,
                max_entries=replay_max_entries,
                max_bytes=replay_max_bytes,
            ),
        )
        self.client_id = client_id
        self.session_expiry_s = session_expiry_s
        self.client = client  # shared with the replica's Sender
        self.client.manual_ack_set(True)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message
        # (topic, reason) of the refusals logged this hour: each is logged once, all counted
        self._logged: BoundedMap[str, bool] = BoundedMap(
            "ingest_refusals_logged",
            max_entries=10_000,
            max_bytes=4 * 2**20,
            size_of=lambda key, _: sys.getsizeof(key) + ENTRY_OVERHEAD,
            ttl_s=3600.0,
        )
        self._connected = threading.Event()
        self.acks = Acks(client, receive_maximum)
        self.light = LightSink(
            registry,
            self.acks,
            lambda channel, outcome: _ingested(channel, outcome).inc(),
            max_messages=light_queue,
            max_bytes=light_queue_bytes,
            workers=light_workers,
            batch_max=batch_max,
            flush_s=light_flush_s,
            on_reported=on_reported,
        )

    # --- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        self.light.start()
        props = connect_properties(self.session_expiry_s, self.receive_maximum)
        self.client.connect_async(
            self.settings.host,
            self.settings.port,
            keepalive=self.settings.keepalive_s,
            clean_start=False,
            properties=props,
        )
        self.client.loop_start()

    def wait_connected(self, timeout_s: float) -> bool:
        """True once connected *and* subscribed: from then on the broker hands us our share."""
        return self._connected.wait(timeout_s)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def hold(self) -> None:
        """Take no more messages: what arrives from now on is left unacknowledged, so the
        broker sends it again when this session resumes (the cases in hand still finish
        and their verdicts go out while we are connected)."""
        self.client.on_message = _left_for_redelivery

    def stop(self) -> None:
        """Store and acknowledge what was taken, then disconnect, keeping the subscriptions:
        the broker queues what comes for this session (`session_expiry_s`) until it resumes.
        A replica removed for good leaves its queue to expire with the session; the devices
        send unanswered cases again (`uplink.resend_unanswered_s`)."""
        self.hold()
        self.light.stop()
        self.client.disconnect()
        self.client.loop_stop()

    def _subscriptions(self) -> list[tuple[str, mqtt.SubscribeOptions]]:
        """Our filters. Retained messages are never replayed to the cloud when it subscribes
        (a device's retained status is not news, and what a device left retained cannot
        greet every start: Mosquitto 2.0 sends them on shared subscriptions too), and a
        retained publish is seen as such (retain-as-published), to be refused where the
        contract never retains."""
        options = mqtt.SubscribeOptions(
            qos=1,
            retainAsPublished=True,
            retainHandling=mqtt.SubscribeOptions.RETAIN_DO_NOT_SEND,
        )
        return [(self.topics.all_devices(c, self.share_group), options) for c in CHANNELS]

    # --- paho callbacks (network thread: never block here) --------------------------

    def _on_connect(
        self,
        client: mqtt.Client,
        userdata: object,
        flags: mqtt.ConnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if reason_code.is_failure:
            log.error("broker refused the connection: %s", reason_code)
            return
        client.subscribe(self._subscriptions())

    def _on_subscribe(
        self,
        client: mqtt.Client,
        userdata: object,
        mid: int,
        reason_codes: list[ReasonCode],
        properties: Properties | None,
    ) -> None:
        refused = [str(rc) for rc in reason_codes if rc.is_failure]
        if refused:  # e.g. broker rules without the cloud's shared subscription: not ready
            log.error("the broker refused the ingest subscriptions: %s", ", ".join(refused))
            return
        self._connected.set()
        BROKER_CONNECTED.set(1)
        log.info(
            "ingest connected",
            extra={"client_id": self.client_id, "group": self.share_group or "(plain)"},
        )

    def _on_disconnect(
        self,
        client: mqtt.Client,
        userdata: object,
        flags: mqtt.DisconnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        self._connected.clear()
        BROKER_CONNECTED.set(0)
        log.warning("ingest disconnected: %s", reason_code)

    def _on_message(self, client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        mid, qos = message.mid, message.qos
        if qos > 0:
            self.acks.taken()
        try:
            wire = from_paho(message)
            if wire.retained and _channel(wire) in _NEVER_RETAINED:
                raise PayloadRejected("retained", "telemetry and cases are never retained")
            verified = self.verifier.verify(wire)
        except ReplayedMessage as exc:
            verified = exc.verified
            if not isinstance(verified.message, EscalationCase):
                _ingested(_channel(wire), "replayed").inc()
                self.acks.ack(mid, qos)
                return
            # Answered again from the store by the processor (claim says DONE).
            _ingested("escalations", "replayed").inc()
        except PayloadRejected as exc:
            self._reject(wire, exc)
            self.acks.ack(mid, qos)
            return
        except Exception:  # a verifier crash must not kill the network thread
            _ingested("unknown", "error").inc()
            log.exception("taking in a message failed")
            self.acks.ack(mid, qos)
            return
        if isinstance(verified.message, EscalationCase):
            self._take_case(verified, mid, qos)
            return
        self.light.offer(verified, mid, qos, len(wire.payload), _channel(wire))

    def _reject(self, wire: WireMessage, exc: PayloadRejected) -> None:
        """Count every refusal; log it once per topic and reason (one device cannot flood
        the log)."""
        _ingested(_channel(wire), f"rejected_{exc.reason}").inc()
        if self._logged.add_if_absent(f"{wire.topic}\0{exc.reason}", True):
            log.warning(
                "rejected message on %s: %s (further ones there are counted, not logged)",
                wire.topic,
                exc.message,
                extra={"reason": exc.reason},
            )

    def _take_case(self, verified: Verified, mid: int, qos: int) -> None:
        assert isinstance(verified.message, EscalationCase)
        try:
            future = self.processor.submit(
                verified.message,
                verified.image or b"",
                source="mqtt",
                flow_controlled=True,
                meta=verified.meta,
            )
        except EdgefleetError as exc:
            _ingested("escalations", exc.code).inc()
            self.acks.ack(mid, qos)
            return

        def done(f: Future[CloudVerdict | None]) -> None:
            exc = f.exception()
            outcome = "stored" if exc is None else getattr(exc, "code", "failed")
            _ingested("escalations", outcome).inc()
            self.acks.ack(mid, qos)

        future.add_done_callback(done)


def _left_for_redelivery(client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
    """While stopping: not acknowledged, so the broker keeps it for the next session."""


_KNOWN = {c.value for c in CHANNELS}
_NEVER_RETAINED = {Channel.TELEMETRY.value, Channel.ESCALATIONS.value}


def _channel(wire: WireMessage) -> str:
    """A metrics label from the topic, bounded to our channels."""
    last = wire.topic.rsplit("/", 1)[-1]
    return last if last in _KNOWN else "unknown"
