"""What the cloud says to devices over MQTT, each message signed with its device's key:
verdicts, the cloud's lag (retained) and, for the fleet's rollouts, desired states.

It shares the replica's one MQTT client with the ingest, and is built before the case
processor and the rollouts that send through it (the ingest, which feeds the processor,
comes after them).
"""

from __future__ import annotations

import logging

import paho.mqtt.client as mqtt

from edgefleet.cloud.registry import Registry
from edgefleet.shared.messages import CloudStatus, CloudVerdict, utcnow
from edgefleet.shared.mqtt import publish
from edgefleet.shared.topics import Topics
from edgefleet.shared.wire import WireMessage, encode

log = logging.getLogger(__name__)


class Sender:
    def __init__(self, client: mqtt.Client, registry: Registry, topics: Topics):
        self.client = client
        self.registry = registry
        self.topics = topics

    def verdict(self, verdict: CloudVerdict) -> mqtt.MQTTMessageInfo | None:
        """Sign with the device's key and send on its results topic (QoS 1), stamped now.

        A verdict's `ts` says when it was sent, as every message's does: a stored verdict
        sent again for a case the device resent, minutes later, must pass the device's
        staleness check like a new one (its original time stays in the store)."""
        key = self.registry.device_key(verdict.device_id)
        if key is None:
            log.warning("no key for %s: verdict stored, not published", verdict.device_id)
            return None
        sent = verdict.model_copy(update={"ts": utcnow()})
        return publish(self.client, encode(sent, key, self.topics.results(verdict.device_id)))

    def status(self, status: CloudStatus) -> None:
        """The cloud's lag, retained on the device's results topic."""
        key = self.registry.device_key(status.device_id)
        if key is not None:
            wire = encode(status, key, self.topics.results(status.device_id))
            publish(self.client, wire, qos=1, retain=True)

    def wire(self, wire: WireMessage, retain: bool = False) -> None:
        """A message signed already (the rollout controller's desired states, retained)."""
        publish(self.client, wire, qos=1, retain=retain)
