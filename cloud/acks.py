"""The ingest's window of QoS 1 messages taken and not yet acknowledged: at the CONNECT
property Receive Maximum the broker must hold the rest (flow control instead of memory
growth), counted like a full REST queue."""

from __future__ import annotations

import threading

import paho.mqtt.client as mqtt
from prometheus_client import Gauge

from edgefleet.cloud.jobs import BACKPRESSURE
from edgefleet.shared.gauges import observe

UNACKED = Gauge(
    "ef_cloud_mqtt_unacked", "QoS 1 messages taken but not yet acknowledged (<= receive_maximum)"
)


class Acks:
    """Manual acknowledgements on the ingest's client, and how many are owed."""

    def __init__(self, client: mqtt.Client, receive_maximum: int) -> None:
        self.client = client
        self.receive_maximum = receive_maximum
        self._owed = 0
        self._lock = threading.Lock()
        observe(UNACKED, self, lambda acks: acks._owed)

    def taken(self) -> None:
        """One more QoS 1 message held."""
        with self._lock:
            self._owed += 1
            if self._owed >= self.receive_maximum:
                BACKPRESSURE.labels("mqtt").inc()

    def full(self) -> bool:
        """The broker can send nothing more before our acks."""
        return self._owed >= self.receive_maximum

    def ack(self, mid: int, qos: int) -> None:
        if qos > 0:
            with self._lock:
                self._owed = max(0, self._owed - 1)
            self.client.ack(mid, qos)
