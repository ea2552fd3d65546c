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
import queue
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, NamedTuple

import paho.mqtt.client as mqtt
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from prometheus_client import Counter, Gauge, Histogram

from edgefleet.cloud.directory import DeviceDirectory
from edgefleet.cloud.jobs import BACKPRESSURE
from edgefleet.cloud.processor import CaseProcessor
from edgefleet.shared.bounded import ENTRY_OVERHEAD, BoundedMap
from edgefleet.shared.errors import EdgefleetError, PayloadRejected
from edgefleet.shared.gauges import observe
from edgefleet.shared.messages import (
    CloudVerdict,
    DeviceStatus,
    DeviceTelemetry,
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
LIGHT_QUEUE_DEPTH = Gauge("ef_cloud_light_queue_depth", "Telemetry/status waiting to be stored")
LIGHT_QUEUE_BYTES = Gauge(
    "ef_cloud_light_queue_bytes", "Payload bytes of the telemetry/status waiting to be stored"
)
BATCH_SIZE = Histogram(
    "ef_cloud_light_batch_size",
    "Telemetry/status/reported messages stored per transaction",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500),
)
BATCH_FALLBACKS = Counter(
    "ef_cloud_light_batch_fallbacks_total",
    "Batches whose transaction failed and were stored message by message",
)
UNACKED = Gauge(
    "ef_cloud_mqtt_unacked", "QoS 1 messages taken but not yet acknowledged (<= receive_maximum)"
)


@functools.cache
def _ingested(channel: str, outcome: str) -> Any:
    """The counter child of one (channel, outcome): looked up once, not per message."""
    return INGESTED.labels(channel, outcome)


class Light(NamedTuple):
    """A telemetry, status or reported message waiting to be stored, and acked after."""

    verified: Verified
    mid: int
    qos: int
    size: int  # payload bytes


CHANNELS = (Channel.ESCALATIONS, Channel.TELEMETRY, Channel.STATUS, Channel.REPORTED)


class Ingest:
    def __init__(
        self,
        mqtt_settings: MqttSettings,
        client: mqtt.Client,
        directory: DeviceDirectory,
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
        self.directory = directory
        self.processor = processor
        self.share_group = share_group
        self.receive_maximum = receive_maximum
        self.topics = Topics(mqtt_settings.topic_root)
        self.verifier = Verifier(
            key_for_device=directory.device_key,
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
        self.on_reported = on_reported
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
        self._unacked = 0
        self._unacked_lock = threading.Lock()
        self._light_max = light_queue
        self._light_bytes_max = light_queue_bytes
        self._light_bytes = 0  # payload bytes waiting; QoS 1 ones are bounded by the broker
        self._light_bytes_lock = threading.Lock()
        self._batch_max = batch_max
        self._flush_s = light_flush_s
        self._collecting = threading.Lock()  # one worker fills a batch while others store
        self._light: queue.Queue[Light | None] = queue.Queue()
        # read when scraped, not set per message (a gauge update costs more than the count)
        observe(LIGHT_QUEUE_DEPTH, self, lambda ingest: ingest._light.qsize())
        observe(LIGHT_QUEUE_BYTES, self, lambda ingest: ingest._light_bytes)
        observe(UNACKED, self, lambda ingest: ingest._unacked)
        self._light_workers = [
            threading.Thread(target=self._light_loop, name=f"ingest-light-{i}", daemon=True)
            for i in range(light_workers)
        ]

    # --- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        for worker in self._light_workers:
            worker.start()
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
        for _ in self._light_workers:
            self._light.put(None)
        for worker in self._light_workers:
            if worker.ident is not None:  # started (services closed before start: not)
                worker.join(timeout=5)
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
            self._taken()
        try:
            wire = from_paho(message)
            if wire.retained and _channel(wire) in _NEVER_RETAINED:
                raise PayloadRejected("retained", "telemetry and cases are never retained")
            verified = self.verifier.verify(wire)
        except ReplayedMessage as exc:
            verified = exc.verified
            if not isinstance(verified.message, EscalationCase):
                _ingested(_channel(wire), "replayed").inc()
                self._ack(mid, qos)
                return
            # Answered again from the store by the processor (claim says DONE).
            _ingested("escalations", "replayed").inc()
        except PayloadRejected as exc:
            self._reject(wire, exc)
            self._ack(mid, qos)
            return
        except Exception:  # a verifier crash must not kill the network thread
            _ingested("unknown", "error").inc()
            log.exception("taking in a message failed")
            self._ack(mid, qos)
            return
        if isinstance(verified.message, EscalationCase):
            self._take_case(verified, mid, qos)
            return
        size = len(wire.payload)
        with self._light_bytes_lock:
            full = self._light.qsize() >= self._light_max or (
                self._light_bytes + size > self._light_bytes_max
            )
            if qos == 0 and full:
                BACKPRESSURE.labels("mqtt_light").inc()
                _ingested(_channel(wire), "dropped_full").inc()
                return
            self._light_bytes += size
        self._light.put(Light(verified, mid, qos, size))

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
            self._ack(mid, qos)
            return

        def done(f: Future[CloudVerdict | None]) -> None:
            exc = f.exception()
            outcome = "stored" if exc is None else getattr(exc, "code", "failed")
            _ingested("escalations", outcome).inc()
            self._ack(mid, qos)

        future.add_done_callback(done)

    def _taken(self) -> None:
        """One more QoS 1 message held; at `receive_maximum` the broker must hold the rest,
        which is our backpressure on MQTT: counted like a full REST queue."""
        with self._unacked_lock:
            self._unacked += 1
            if self._unacked >= self.receive_maximum:
                BACKPRESSURE.labels("mqtt").inc()

    def _ack(self, mid: int, qos: int) -> None:
        if qos > 0:
            with self._unacked_lock:
                self._unacked = max(0, self._unacked - 1)
            self.client.ack(mid, qos)

    # --- telemetry, status, reported ------------------------------------------------

    def _light_loop(self) -> None:
        """Store telemetry, status and reported messages in batches, one transaction each,
        acknowledged to the broker only after it commits. One worker at a time fills a
        batch while the others store theirs."""
        while True:
            with self._collecting:
                batch, stop = self._collect()
            if batch:
                self._store_batch(batch)
            if stop:
                return

    def _collect(self) -> tuple[list[Light], bool]:
        """The next batch, and whether the stop mark was met. Having its first message, a
        batch waits up to `light_flush_s` for more (a transaction costs about what eight
        messages cost, so a replica that sees a share of the fleet must still write large
        batches), but not once the broker can send nothing more before our acks."""
        item = self._light.get()
        if item is None:
            return [], True
        batch = [item]
        deadline = time.monotonic() + self._flush_s
        while len(batch) < self._batch_max:
            try:
                more = self._light.get_nowait()
            except queue.Empty:
                wait = deadline - time.monotonic()
                if wait <= 0 or self._unacked >= self.receive_maximum:
                    break
                try:
                    more = self._light.get(timeout=wait)
                except queue.Empty:
                    break
            if more is None:
                return batch, True
            batch.append(more)
        return batch, False

    def _store_batch(self, batch: list[Light]) -> None:
        try:
            with self.directory.batch():
                # rows in one order in every replica: two batches never wait on each other
                # crosswise (a deadlock on PostgreSQL, which fails both)
                ordered = [item.verified.message for item in sorted(batch, key=_lock_order)]
                telemetry = [m for m in ordered if isinstance(m, DeviceTelemetry)]
                self.directory.record_telemetries(telemetry)
                for message in ordered:
                    if not isinstance(message, DeviceTelemetry):
                        self._record(message)
            outcomes = ["stored"] * len(batch)
        except Exception as exc:  # one bad message must not fail the rest: one by one
            BATCH_FALLBACKS.inc()
            log.warning("a batch of %d failed (%s): storing them one by one", len(batch), exc)
            outcomes = [self._record_alone(item.verified) for item in batch]
        with self._light_bytes_lock:
            self._light_bytes -= sum(item.size for item in batch)
        for (verified, mid, qos, _), outcome in zip(batch, outcomes, strict=True):
            message = verified.message
            _ingested(_channel_of(message), outcome).inc()
            if outcome == "stored" and isinstance(message, ReportedState) and self.on_reported:
                try:
                    self.on_reported(message)
                except Exception:  # the rollout controller logs its own; keep storing
                    log.exception("rollout update for %s failed", verified.device_id)
            self._ack(mid, qos)
        BATCH_SIZE.observe(len(batch))

    def _record(self, message: object) -> None:
        if isinstance(message, DeviceTelemetry):
            self.directory.record_telemetry(message)
        elif isinstance(message, DeviceStatus):
            self.directory.record_status(message)
        elif isinstance(message, ReportedState):
            self.directory.record_reported(message)

    def _record_alone(self, verified: Verified) -> str:
        channel = _channel_of(verified.message)
        try:
            self._record(verified.message)
            return "stored"
        except EdgefleetError as exc:
            log.warning("storing %s from %s failed: %s", channel, verified.device_id, exc)
            return exc.code
        except Exception:  # keep the worker alive; the message is counted and logged
            log.exception("storing %s from %s failed", channel, verified.device_id)
            return "error"


def _left_for_redelivery(client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
    """While stopping: not acknowledged, so the broker keeps it for the next session."""


def _lock_order(item: Light) -> tuple[str, float]:
    return (item.verified.device_id, item.verified.message.ts.timestamp())


def _channel_of(message: object) -> str:
    schema = getattr(message, "schema_id", "")
    return schema.split("/")[0].removeprefix("ef.")


_KNOWN = {c.value for c in CHANNELS}
_NEVER_RETAINED = {Channel.TELEMETRY.value, Channel.ESCALATIONS.value}


def _channel(wire: WireMessage) -> str:
    """A metrics label from the topic, bounded to our channels."""
    last = wire.topic.rsplit("/", 1)[-1]
    return last if last in _KNOWN else "unknown"
