"""A desired state's way to its device: each model's download link signed for that device,
the state signed with the device's key and sent retained on its `desired` topic, and kept
in the registry (for rollbacks and the views). Retained messages are what make offline
devices safe: a device that was away gets the last desired state the moment it
subscribes again."""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import Counter

from edgefleet.fleet.models import ModelStore
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.shared.messages import DesiredState
from edgefleet.shared.topics import Topics
from edgefleet.shared.wire import WireMessage, encode

log = logging.getLogger(__name__)

DESIRED_SENT = Counter("ef_fleet_desired_published_total", "Desired states published", ["kind"])
Publish = Callable[[WireMessage, bool], None]


class DesiredPublisher:
    def __init__(
        self,
        registry: DeviceRegistry,
        publish: Publish,
        *,
        topics: Topics = Topics(),
        model_store: ModelStore | None = None,
    ):
        self.registry = registry
        self.publish = publish
        self.topics = topics
        self.model_store = model_store

    def send(self, device: str, desired: DesiredState | None, *, kind: str) -> None:
        """Send `desired` (None clears the retained state: the device keeps what it runs);
        a revoked device is skipped."""
        key = self.registry.device_key(device)
        if key is None:
            log.warning("device revoked during rollout; skipped", extra={"device_id": device})
            return
        topic = self.topics.desired(device)
        if desired is not None and self.model_store is not None:
            store = self.model_store
            models = [store.for_device(m, device, key) for m in desired.models]
            desired = desired.model_copy(update={"models": models})
        if desired is None:
            # nothing to go back to: clear the retained state; the device keeps what it runs
            self.publish(WireMessage(topic, b"", ()), True)
        else:
            self.publish(encode(desired, key, topic), True)
        self.registry.set_desired(desired, device)
        DESIRED_SENT.labels(kind).inc()
