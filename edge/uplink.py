"""MQTT 5 uplink: drains the outbox at QoS 1 and deletes a message only on a good PUBACK.

- Persistent session (clean_start False), last will `offline` retained on `status`,
  `online` retained on every connect; paho reconnects with backoff and resends what was
  in flight.
- Live first, backlog paced: after a (re)connect, what was already stored is replayed at
  `replay_rate_per_s` while new messages go out at once, so an outage's backlog does not
  starve live traffic (which rows go when: `edgefleet.edge.delivery`).
- Signing happens when a message is sent, over the bytes the outbox stored; one stored
  too long is given a fresh `ts` first (`edgefleet.edge.stamping`).
- An escalation acknowledged but not answered after `resend_unanswered_s` is sent again
  (edgefleet.edge.outbox keeps it until the verdict): the broker's PUBACK is not the end.
- Incoming `results` and `desired` are verified with the device key before any use
  (`edgefleet.edge.incoming`).
- One device id, one agent: connections the broker keeps closing soon after they are made
  are another agent's takeovers (`edgefleet.edge.takeover`); the newcomer sets
  `taken_over` and stops reconnecting.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

import paho.mqtt.client as mqtt
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from prometheus_client import Counter, Gauge

from edgefleet.edge.delivery import Delivery
from edgefleet.edge.incoming import Incoming
from edgefleet.edge.outbox import Outbox, OutboxItem
from edgefleet.edge.outbox_tally import OutboxKind
from edgefleet.edge.settings import UplinkSettings
from edgefleet.edge.stamping import Stamping
from edgefleet.edge.takeover import TakeoverWatch
from edgefleet.shared import mqtt as ef_mqtt
from edgefleet.shared.messages import DeviceState, DeviceStatus, Message
from edgefleet.shared.topics import Channel, Topics, channel_of
from edgefleet.shared.wire import (
    Verified,
    WireMessage,
    encode,
)

log = logging.getLogger(__name__)

PUBLISHED = Counter("ef_edge_uplink_published_total", "Messages handed to the broker", ["kind"])
CONNECTED = Gauge("ef_edge_uplink_connected", "1 while the broker connection is up")
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
        wall_clock: Callable[[], float] = time.time,
    ):
        self.mqtt_settings = mqtt_settings
        self.settings = settings
        self.device_id = device_id
        self.key = key
        self.outbox = outbox
        self.agent_version = agent_version
        self.topics = Topics(mqtt_settings.topic_root)
        self.connected = threading.Event()
        self.taken_over = threading.Event()  # another agent runs this device id: stop
        self._takeovers = TakeoverWatch(settings.takeover_s)
        self.delivery = Delivery(
            outbox,
            replay_rate_per_s=settings.replay_rate_per_s,
            resend_after_s=settings.resend_after_s,
            max_inflight=mqtt_settings.max_inflight,
        )
        # PUBACKs from paho's thread to the sender; (-1, True, "connected") on a connect
        self._acks: queue.SimpleQueue[tuple[int, bool, str]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._unanswered_checked = 0.0
        self.incoming = Incoming(
            self.topics, device_id, key, max_skew_s=settings.max_skew_s, handler=on_message
        )
        self.stamping = Stamping(
            self.topics,
            device_id,
            key,
            restamp_after_s=settings.restamp_after_s,
            wall_clock=wall_clock,
        )
        will = self._status_wire("offline")
        self.client = ef_mqtt.make_client(
            mqtt_settings, client_id=ef_mqtt.device_client_id(device_id), will=will
        )
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_connect_fail = self._on_connect_fail
        self.client.on_publish = self._on_publish
        self.client.on_message = self._on_message
        self._thread = threading.Thread(target=self._run, name="uplink-sender", daemon=True)

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> Uplink:
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
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self.client.disconnect()
        self.client.loop_stop()

    def publish_now(self, message: Message, *, retain: bool = False) -> None:
        """Publish without the outbox (status only: its last will covers the gap)."""
        topic = self.topics.for_device(self.device_id, channel_of(message.schema_id))
        ef_mqtt.publish(self.client, encode(message, self.key, topic), qos=1, retain=retain)

    @property
    def inflight(self) -> int:
        return self.delivery.inflight

    @property
    def sent(self) -> dict[OutboxKind, int]:
        """Messages acknowledged by the broker (or handed over, at QoS 0), by kind."""
        return self.delivery.sent

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
        self._takeovers.connected(time.monotonic())
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
        if self._stop.is_set() or self.taken_over.is_set():
            return
        if self._takeovers.lost(time.monotonic()):
            log.error(
                "device id %s is already connected from another agent: this one stops",
                self.device_id,
            )
            self.taken_over.set()
            client.disconnect()  # no reconnect: it would take the other agent's session
        elif self._takeovers.contested:
            log.error(
                "another agent connects with device id %s and takes its broker session; "
                "this agent keeps it (the newcomer stops)",
                self.device_id,
            )

    def _on_connect_fail(self, client: mqtt.Client, userdata: object) -> None:
        self._takeovers.failed()

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
        self.incoming.take(ef_mqtt.from_paho(message))

    # --- sender thread -----------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(0.1)
            self._wake.clear()
            self._drain_acks()
            if not self.connected.is_set():
                continue
            try:
                now = time.monotonic()
                if now - self._unanswered_checked >= UNANSWERED_CHECK_S:
                    self._unanswered_checked = now
                    self.outbox.answers.resend(
                        self.settings.resend_unanswered_s, self.settings.max_unanswered_resends
                    )
                while self.connected.is_set() and (batch := self.delivery.next_batch()):
                    for item in batch:
                        self._publish(item)
            except Exception:  # keep the sender alive; the rows stay in the outbox
                log.exception("uplink sender error")
                time.sleep(0.5)
        self._drain_acks()

    def _publish(self, item: OutboxItem) -> None:
        wire = self.stamping.wire_of(item)
        if wire is None:  # unreadable row (cannot happen unless the file was edited): drop
            self.outbox.ack([item.id])
            return
        info = ef_mqtt.publish(self.client, wire, qos=item.qos, retain=item.retain)
        if info.rc != mqtt.MQTT_ERR_SUCCESS and info.rc != mqtt.MQTT_ERR_NO_CONN:
            log.warning("publish of %s %d failed: %s", item.kind, item.id, info.rc)
            self.delivery.not_published(item)
            return
        PUBLISHED.labels(item.kind).inc()
        self.delivery.published(item, info.mid, item.qos)

    def _drain_acks(self) -> None:
        acks: list[tuple[int, bool, str]] = []
        while True:
            try:
                ack = self._acks.get_nowait()
            except queue.Empty:
                break
            if ack[0] == -1:  # (re)connected: settle what came before, then a new segment
                self.delivery.acked(acks)
                acks = []
                self.delivery.connected()
            else:
                acks.append(ack)
        self.delivery.acked(acks)
