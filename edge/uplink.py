"""MQTT 5 uplink: drains the outbox at QoS 1 and deletes a message only on a good PUBACK.

- Persistent session (clean_start False), last will `offline` retained on `status`,
  `online` retained on every connect; paho reconnects with backoff and resends what was
  in flight.
- Live first, backlog paced: after a (re)connect, what was already stored is replayed at
  `replay_rate_per_s` while new messages go out at once, so an outage's backlog does not
  starve live traffic.
- An escalation acknowledged but not answered after `resend_unanswered_s` is sent again
  (edgefleet.edge.outbox keeps it until the verdict): the broker's PUBACK is not the end.
- Signing happens when a message is sent: a message older than `restamp_after_s` gets a
  fresh `ts` (and signature) so the cloud's staleness check does not reject a replay.
- Incoming `results` and `desired` are verified with the device key before any use.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import paho.mqtt.client as mqtt
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from prometheus_client import Counter, Gauge

from edgefleet.edge.outbox import Outbox, OutboxItem
from edgefleet.edge.settings import UplinkSettings
from edgefleet.shared import mqtt as ef_mqtt
from edgefleet.shared.errors import PayloadRejected
from edgefleet.shared.messages import MESSAGE_TYPES, DeviceState, DeviceStatus, Message, utcnow
from edgefleet.shared.topics import Channel, Topics
from edgefleet.shared.wire import ReplayGuard, Verified, Verifier, WireMessage, encode

log = logging.getLogger(__name__)

PUBLISHED = Counter("ef_edge_uplink_published_total", "Messages handed to the broker", ["kind"])
NACKED = Counter("ef_edge_uplink_nacked_total", "PUBACKs with a failure reason code", ["reason"])
RESENT = Counter("ef_edge_uplink_resent_total", "Messages published again after a timeout")
CONNECTED = Gauge("ef_edge_uplink_connected", "1 while the broker connection is up")
INCOMING = Counter("ef_edge_uplink_incoming_total", "Messages received", ["channel", "outcome"])
UNANSWERED_CHECK_S = 5.0  # how often acknowledged but unanswered escalations are looked at


class Uplink:
    """Owns the MQTT client and the sender thread."""

    def __init__(
        self,
        mqtt_settings: ef_mqtt.MqttSettings,
        settings: UplinkSettings,
        *,
        device_id: str,
        key: bytes,
        outbox: Outbox,
        agent_version: str,
        on_message: Callable[[Channel, Verified], None] | None = None,
    ):
        self.mqtt_settings = mqtt_settings
        self.settings = settings
        self.device_id = device_id
        self.key = key
        self.outbox = outbox
        self.agent_version = agent_version
        self.topics = Topics(mqtt_settings.topic_root)
        self.on_message = on_message
        self.connected = threading.Event()
        self.sent: dict[str, int] = {}
        self._acks: queue.SimpleQueue[tuple[int, bool, str]] = queue.SimpleQueue()
        self._inflight: dict[int, tuple[int, float, str]] = {}  # mid -> (row id, sent at, kind)
        self._inflight_rows: set[int] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._live_after = 0  # rows above this are live
        self._backlog_cursor = 0  # rows in (cursor, live_after] are backlog still to send
        self._replay_tokens = 0.0
        self._connected_since = 0.0
        self._unanswered_checked = 0.0
        keys = lambda device: key if device == device_id else None  # noqa: E731
        self._verifier = Verifier(key_for_device=keys, topics=self.topics)
        # A retained desired state may be days old: it is checked for signature, not age.
        self._desired_verifier = Verifier(
            key_for_device=keys,
            topics=self.topics,
            max_skew_s=timedelta(days=3650).total_seconds(),
            replay_guard=ReplayGuard(window_s=1.0),
        )
        will = self._status_wire("offline")
        self.client = ef_mqtt.make_client(
            mqtt_settings, client_id=ef_mqtt.device_client_id(device_id), will=will
        )
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_publish = self._on_publish
        self.client.on_message = self._on_message
        self._thread = threading.Thread(target=self._run, name="uplink-sender", daemon=True)

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> Uplink:
        self._live_after = self.outbox.max_id()
        self._backlog_cursor = 0
        ef_mqtt.connect(self.client, self.mqtt_settings, clean_start=False)
        self._thread.start()
        return self

    def wake(self) -> None:
        self._wake.set()

    def flush(self, timeout_s: float) -> bool:
        """Wait until the outbox is empty (all acknowledged) or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.outbox.depth() == 0:
                return True
            self._wake.set()
            time.sleep(0.05)
        return self.outbox.depth() == 0

    def stop(self, *, publish_offline: bool = True, timeout_s: float = 5.0) -> None:
        """Publish `offline` (retained), stop the sender and disconnect cleanly."""
        if publish_offline and self.connected.is_set():
            info = ef_mqtt.publish(self.client, self._status_wire("offline"), qos=1, retain=True)
            try:
                info.wait_for_publish(timeout_s)
            except (RuntimeError, ValueError):
                log.warning("offline status not acknowledged before shutdown")
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        self.client.disconnect()
        self.client.loop_stop()

    def publish_now(self, message: Message, *, retain: bool = False) -> None:
        """Publish without the outbox (status only: its last will covers the gap)."""
        topic = self.topics.for_device(self.device_id, _channel_of(message))
        ef_mqtt.publish(self.client, encode(message, self.key, topic), qos=1, retain=retain)

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    # --- paho callbacks (network thread: never block here) -----------------------------

    def _status_wire(self, state: DeviceState) -> WireMessage:
        status = DeviceStatus(
            device_id=self.device_id, state=state, agent_version=self.agent_version
        )
        return encode(status, self.key, self.topics.status(self.device_id))

    def _on_connect(
        self,
        client: mqtt.Client,
        userdata: object,
        flags: mqtt.ConnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if reason_code.is_failure:
            log.warning("broker refused the connection: %s", reason_code)
            return
        log.info("connected to broker (session present: %s)", flags.session_present)
        ef_mqtt.publish(client, self._status_wire("online"), qos=1, retain=True)
        client.subscribe(
            [(self.topics.results(self.device_id), 1), (self.topics.desired(self.device_id), 1)]
        )
        self._acks.put((-1, True, "connected"))  # the sender starts a new backlog segment
        CONNECTED.set(1)
        self.connected.set()
        self._wake.set()

    def _on_disconnect(
        self,
        client: mqtt.Client,
        userdata: object,
        flags: mqtt.DisconnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if self.connected.is_set():
            log.warning("disconnected from broker: %s", reason_code)
        self.connected.clear()
        CONNECTED.set(0)

    def _on_publish(
        self,
        client: mqtt.Client,
        userdata: object,
        mid: int,
        reason_code: ReasonCode,
        properties: Properties,
    ) -> None:
        self._acks.put((mid, not reason_code.is_failure, str(reason_code)))
        self._wake.set()

    def _on_message(self, client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        wire = ef_mqtt.from_paho(message)
        try:
            _, channel = self.topics.parse(wire.topic)
            verifier = self._desired_verifier if channel is Channel.DESIRED else self._verifier
            verified = verifier.verify(wire)
        except PayloadRejected as exc:
            INCOMING.labels("unknown", exc.reason).inc()
            log.warning("rejected a message on %s: %s", wire.topic, exc.message)
            return
        INCOMING.labels(channel.value, "accepted").inc()
        if self.on_message is not None:
            try:
                self.on_message(channel, verified)
            except Exception:  # the application's handler must not take the link down
                log.exception("handler of %s failed", channel.value)

    # --- sender thread -----------------------------------------------------------------

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            self._wake.wait(0.1)
            self._wake.clear()
            self._drain_acks()
            now = time.monotonic()
            self._replay_tokens = min(
                self.settings.replay_rate_per_s,
                self._replay_tokens + (now - last) * self.settings.replay_rate_per_s,
            )
            last = now
            if not self.connected.is_set():
                continue
            try:
                self._resend_stale(now)
                if now - self._unanswered_checked >= UNANSWERED_CHECK_S:
                    self._unanswered_checked = now
                    self.outbox.resend_unanswered(
                        self.settings.resend_unanswered_s, self.settings.max_unanswered_resends
                    )
                self._send_live()
                self._send_backlog()
            except Exception:  # keep the sender alive; the rows stay in the outbox
                log.exception("uplink sender error")
                time.sleep(0.5)
        self._drain_acks()

    def _window(self) -> int:
        return max(0, self.mqtt_settings.max_inflight - len(self._inflight))

    def _send_live(self) -> None:
        while self._window() > 0 and self.connected.is_set():
            items = self.outbox.read(self._live_after, limit=min(64, self._window()))
            if not items:
                return
            for item in items:
                self._live_after = item.id
                self._publish(item)

    def _send_backlog(self) -> None:
        while (
            self._backlog_cursor < self._live_after
            and self._replay_tokens >= 1
            and self._window() > 0
        ):
            limit = max(1, min(64, self._window(), int(self._replay_tokens)))
            items = self.outbox.read(self._backlog_cursor, self._live_after, limit=limit)
            if not items:
                self._backlog_cursor = self._live_after
                return
            for item in items:
                self._backlog_cursor = item.id
                if item.id in self._inflight_rows:
                    continue
                self._replay_tokens -= 1
                self._publish(item)

    def _publish(self, item: OutboxItem) -> None:
        wire = self._wire_of(item)
        if wire is None:  # unreadable row (cannot happen unless the file was edited): drop
            self.outbox.ack([item.id])
            return
        qos = item.qos
        info = ef_mqtt.publish(self.client, wire, qos=qos, retain=item.retain)
        if info.rc != mqtt.MQTT_ERR_SUCCESS and info.rc != mqtt.MQTT_ERR_NO_CONN:
            log.warning("publish of %s %d failed: %s", item.kind, item.id, info.rc)
            self._requeue(item.id)
            return
        PUBLISHED.labels(item.kind).inc()
        if qos == 0:
            self.outbox.ack([item.id])
            self.sent[item.kind] = self.sent.get(item.kind, 0) + 1
            return
        self._inflight[info.mid] = (item.id, time.monotonic(), item.kind)
        self._inflight_rows.add(item.id)

    def _wire_of(self, item: OutboxItem) -> WireMessage | None:
        try:
            data = item.body
            schema = _schema_of(data)
            message = MESSAGE_TYPES[schema].model_validate_json(data)
        except (KeyError, ValueError):
            log.error("outbox row %d is not a message; dropped", item.id)
            return None
        if (utcnow() - message.ts).total_seconds() > self.settings.restamp_after_s:
            message = message.model_copy(update={"ts": utcnow()})
        return encode(message, self.key, item.topic, item.image)

    def _drain_acks(self) -> None:
        done: list[int] = []
        while True:
            try:
                mid, ok, reason = self._acks.get_nowait()
            except queue.Empty:
                break
            if mid == -1:  # (re)connected: what is stored but not in flight is backlog
                self._live_after = max(self._live_after, self.outbox.max_id())
                self._backlog_cursor = 0
                now = time.monotonic()  # paho resends what was in flight: restart its clock
                self._inflight = {m: (r, now, k) for m, (r, _, k) in self._inflight.items()}
                continue
            entry = self._inflight.pop(mid, None)
            if entry is None:
                continue
            row_id, _, kind = entry
            self._inflight_rows.discard(row_id)
            if ok:
                done.append(row_id)
                self.sent[kind] = self.sent.get(kind, 0) + 1
            else:
                NACKED.labels(reason).inc()
                log.warning("broker refused %s %d: %s; will retry", kind, row_id, reason)
                self._requeue(row_id)
        self.outbox.ack(done)

    def _requeue(self, row_id: int) -> None:
        self._backlog_cursor = min(self._backlog_cursor, row_id - 1)

    def _resend_stale(self, now: float) -> None:
        for mid, (row_id, sent_at, _) in list(self._inflight.items()):
            if now - sent_at > self.settings.resend_after_s:
                del self._inflight[mid]
                self._inflight_rows.discard(row_id)
                RESENT.inc()
                self._requeue(row_id)


def _schema_of(body: bytes) -> str:
    # The schema field is serialised first by every Message model; parse it cheaply.
    head = body[:64].decode("utf-8", "replace")
    start = head.index('"schema":"') + len('"schema":"')
    return head[start : head.index('"', start)]


def _channel_of(message: Message) -> Channel:
    from edgefleet.shared.topics import CHANNEL_SCHEMA

    return next(ch for ch, ids in CHANNEL_SCHEMA.items() if message.schema_id in ids)
