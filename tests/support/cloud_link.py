"""The cloud's MQTT side for fleet tests: publishes desired states, ingests reports."""

from __future__ import annotations

import json
import queue
import threading

from edgefleet.shared.errors import EdgefleetError
from edgefleet.shared.messages import DeviceStatus, ReportedState
from edgefleet.shared.mqtt import MqttSettings, connect, from_paho, make_client, publish
from edgefleet.shared.topics import Channel, Topics
from edgefleet.shared.wire import Verifier, WireMessage
from tests.support.fleet import FleetServer


class CloudLink:
    """The cloud's MQTT side for the fleet: publishes desired states, ingests reports."""

    def __init__(self, server: FleetServer, port: int, password: str):
        self.server = server
        self.topics = Topics()
        self.settings = MqttSettings(port=port, username="cloud", password=password)
        self.client = make_client(self.settings, "cloud-test")
        self.verifier = Verifier(server.registry.device_key)
        self.inbox: queue.Queue = queue.Queue()
        self.published: list[tuple[str, str | None]] = []
        self.connected = threading.Event()
        self.client.on_connect = self._on_connect
        self.client.on_message = lambda c, u, m: self.inbox.put(from_paho(m))
        self.worker = threading.Thread(target=self._ingest, daemon=True)

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        client.subscribe(
            [
                (self.topics.all_devices(Channel.REPORTED), 1),
                (self.topics.all_devices(Channel.STATUS), 1),
            ]
        )
        self.connected.set()

    def start(self) -> CloudLink:
        connect(self.client, self.settings, clean_start=True)
        assert self.connected.wait(30)
        self.worker.start()
        return self

    def publish(self, wire: WireMessage, retain: bool) -> None:
        deployment = json.loads(wire.payload)["deployment_id"] if wire.payload else None
        self.published.append((wire.topic, deployment))
        publish(self.client, wire, qos=1, retain=retain)

    def _ingest(self) -> None:
        while True:
            wire = self.inbox.get()
            if wire is None:
                return
            try:
                message = self.verifier.verify(wire).message
                if isinstance(message, DeviceStatus):
                    self.server.registry.record_status(message)
                elif isinstance(message, ReportedState):
                    self.server.registry.record_reported(message)
                    self.server.rollouts.on_reported(message)
            except EdgefleetError:
                continue  # counted by the verifier; a test assertion will tell

    def stop(self) -> None:
        self.inbox.put(None)
        self.client.disconnect()
        self.client.loop_stop()
