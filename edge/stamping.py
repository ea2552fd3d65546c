"""A stored message as it goes out: signed over the bytes the outbox kept, and, when it was
stored longer than `restamp_after_s` ago, parsed, given a fresh `ts` and serialised again
(the only second serialisation), so the cloud's staleness check does not reject a replay."""

from __future__ import annotations

import logging
from collections.abc import Callable

from edgefleet.edge.outbox import OutboxItem
from edgefleet.shared.messages import MESSAGE_TYPES, utcnow
from edgefleet.shared.topics import Topics
from edgefleet.shared.wire import Serialised, WireMessage, serialise, sign

log = logging.getLogger(__name__)


class Stamping:
    def __init__(
        self,
        topics: Topics,
        device_id: str,
        key: bytes,
        *,
        restamp_after_s: float,
        wall_clock: Callable[[], float],
    ) -> None:
        self.topics = topics
        self.device_id = device_id
        self.key = key
        self.restamp_after_s = restamp_after_s
        self._wall_clock = wall_clock  # ages stored messages (the outbox stamps wall time)

    def wire_of(self, item: OutboxItem) -> WireMessage | None:
        """The signed message for one outbox row; None for a row that is not a message."""
        message = item.message
        if self._wall_clock() - item.created > self.restamp_after_s:
            restamped = _restamped(message)
            if restamped is None:
                log.error("outbox row %d is not a message; dropped", item.id)
                return None
            message = restamped
        return sign(message, self.key, self.topics.for_device(self.device_id, item.channel))


def _restamped(stored: Serialised) -> Serialised | None:
    """The stored message with `ts` now, serialised again; None if it does not parse."""
    try:
        message = MESSAGE_TYPES[stored.schema_id].model_validate_json(stored.json)
    except (KeyError, ValueError):
        return None
    return serialise(message.model_copy(update={"ts": utcnow()}), stored.image)
