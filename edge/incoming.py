"""What the broker brings the device (`results`, `desired`): verified with the device key
before any use, counted by channel and outcome, then handed to the agent's handler."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from prometheus_client import Counter

from edgefleet.shared.errors import PayloadRejected
from edgefleet.shared.topics import Channel, Topics
from edgefleet.shared.wire import ReplayGuard, Verified, Verifier, WireMessage

log = logging.getLogger(__name__)

INCOMING = Counter("ef_edge_uplink_incoming_total", "Messages received", ["channel", "outcome"])


class Incoming:
    def __init__(
        self,
        topics: Topics,
        device_id: str,
        key: bytes,
        *,
        max_skew_s: float,
        handler: Callable[[Channel, Verified], None] | None,
    ) -> None:
        self.topics = topics
        self.handler = handler
        keys = lambda device: key if device == device_id else None  # noqa: E731
        self._verifier = Verifier(key_for_device=keys, topics=topics, max_skew_s=max_skew_s)
        # A retained desired state may be days old: it is checked for signature, not age.
        self._desired_verifier = Verifier(
            key_for_device=keys,
            topics=topics,
            max_skew_s=timedelta(days=3650).total_seconds(),
            replay_guard=ReplayGuard(window_s=1.0),
        )

    def take(self, wire: WireMessage) -> None:
        """Verify one message and hand it over; a refused one is counted and logged."""
        try:
            _, channel = self.topics.parse(wire.topic)
            verifier = self._desired_verifier if channel is Channel.DESIRED else self._verifier
            verified = verifier.verify(wire)
        except PayloadRejected as exc:
            INCOMING.labels("unknown", exc.reason).inc()
            log.warning("rejected a message on %s: %s", wire.topic, exc.message)
            return
        INCOMING.labels(channel.value, "accepted").inc()
        if self.handler is not None:
            try:
                self.handler(channel, verified)
            except Exception:  # the application's handler must not take the link down
                log.exception("handler of %s failed", channel.value)
