"""The only place MQTT topic names are built or parsed."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from edgefleet.shared.errors import PayloadRejected
from edgefleet.shared.messages import DEVICE_ID_PATTERN

DEFAULT_ROOT = "ef/v1"
_DEVICE_RE = re.compile(DEVICE_ID_PATTERN)


class Channel(str, Enum):
    STATUS = "status"
    TELEMETRY = "telemetry"
    ESCALATIONS = "escalations"
    RESULTS = "results"
    DESIRED = "desired"
    REPORTED = "reported"


# Which schemas may appear on which channel (current first, older still accepted): a
# message on the wrong channel is rejected.
CHANNEL_SCHEMA: dict[Channel, tuple[str, ...]] = {
    Channel.STATUS: ("ef.status/1",),
    Channel.TELEMETRY: ("ef.telemetry/1",),
    Channel.ESCALATIONS: ("ef.escalation/2", "ef.escalation/1"),
    Channel.RESULTS: ("ef.verdict/2", "ef.verdict/1", "ef.cloud-status/1"),
    Channel.DESIRED: ("ef.desired/1",),
    Channel.REPORTED: ("ef.reported/1",),
}


@dataclass(frozen=True)
class Topics:
    """Topic builders for one topic root (`ef/v1` unless configured)."""

    root: str = DEFAULT_ROOT

    def for_device(self, device_id: str, channel: Channel) -> str:
        if not _DEVICE_RE.match(device_id):
            raise ValueError(f"invalid device id {device_id!r}")
        return f"{self.root}/{device_id}/{channel.value}"

    def status(self, device_id: str) -> str:
        return self.for_device(device_id, Channel.STATUS)

    def telemetry(self, device_id: str) -> str:
        return self.for_device(device_id, Channel.TELEMETRY)

    def escalations(self, device_id: str) -> str:
        return self.for_device(device_id, Channel.ESCALATIONS)

    def results(self, device_id: str) -> str:
        return self.for_device(device_id, Channel.RESULTS)

    def desired(self, device_id: str) -> str:
        return self.for_device(device_id, Channel.DESIRED)

    def reported(self, device_id: str) -> str:
        return self.for_device(device_id, Channel.REPORTED)

    def device_prefix(self, device_id: str) -> str:
        """The subtree a device may publish under (used for broker ACLs)."""
        return f"{self.root}/{device_id}/#"

    def all_devices(self, channel: Channel, share_group: str | None = None) -> str:
        """Wildcard subscription for one channel of every device, optionally shared."""
        topic = f"{self.root}/+/{channel.value}"
        return f"$share/{share_group}/{topic}" if share_group else topic

    def parse(self, topic: str) -> tuple[str, Channel]:
        """Device id and channel of a topic; PayloadRejected('topic') if it is not ours."""
        prefix = self.root + "/"
        parts = topic[len(prefix) :].split("/") if topic.startswith(prefix) else []
        if len(parts) != 2 or not _DEVICE_RE.match(parts[0]):
            raise PayloadRejected("topic", f"topic {topic!r} is not under {self.root}/<device>/")
        try:
            return parts[0], Channel(parts[1])
        except ValueError:
            raise PayloadRejected("topic", f"unknown channel in topic {topic!r}") from None


def channel_of(schema_id: str) -> Channel:
    """The one channel a schema travels on (ValueError for an unknown schema)."""
    for channel, schema_ids in CHANNEL_SCHEMA.items():
        if schema_id in schema_ids:
            return channel
    raise ValueError(f"no channel carries schema {schema_id!r}")
