from __future__ import annotations

import pytest

from edgefleet.shared.errors import PayloadRejected
from edgefleet.shared.topics import Channel, Topics


def test_builders_and_parse_agree():
    topics = Topics()
    for channel in Channel:
        topic = topics.for_device("cam-01", channel)
        assert topic == f"ef/v1/cam-01/{channel.value}"
        assert topics.parse(topic) == ("cam-01", channel)


def test_configurable_root_and_shared_subscription():
    topics = Topics("site7/ef/v1")
    assert topics.results("cam-9") == "site7/ef/v1/cam-9/results"
    assert topics.all_devices(Channel.ESCALATIONS) == "site7/ef/v1/+/escalations"
    assert (
        topics.all_devices(Channel.TELEMETRY, share_group="cloud")
        == "$share/cloud/site7/ef/v1/+/telemetry"
    )


@pytest.mark.parametrize(
    "topic",
    [
        "ef/v1/cam-01",
        "ef/v1/CAM/status",
        "ef/v1/cam-01/other",
        "other/cam-01/status",
        "ef/v1/a/b/c",
    ],
)
def test_foreign_topics_are_rejected(topic):
    with pytest.raises(PayloadRejected) as err:
        Topics().parse(topic)
    assert err.value.reason == "topic"


def test_invalid_device_id_cannot_build_a_topic():
    with pytest.raises(ValueError):
        Topics().telemetry("../cam")
