"""A case a replica left unanswered when it died is swept as soon as it starts again, and
its verdict reaches the device: the sweep's first run does not beat the wiring of the
verdict's way out (it once did, and the verdict was stored and never sent)."""

from __future__ import annotations

import threading
from pathlib import Path

from edgefleet.bench.harness import escalation_case, verdict_of
from edgefleet.cloud.services import CloudServices
from edgefleet.cloud.settings import CloudSettings
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.shared.db import Database
from edgefleet.shared.mqtt import MqttSettings, connect, device_client_id, make_client
from tests.support.cloud import PNG


def test_a_case_left_by_a_crash_is_answered_to_the_device_after_restart(
    own_broker, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    db = Database.connect(f"sqlite:///{data / 'cloud.db'}")
    DeviceRegistry(db).enroll("cam-sw")
    db.close()
    rules = tmp_path / "rules.yaml"
    rules.write_text("default: {model: rules, timeout_s: 5}\n")
    settings = CloudSettings(
        data_dir=data,
        mqtt={"host": own_broker.host, "port": own_broker.port},
        models={"preload": False},
        rules={"file": rules},
        queue={"workers": 1},
    )
    # given a case this replica claimed in its previous life and never answered
    first = CloudServices.build(settings)
    case = escalation_case("cam-sw")
    first.store.ledger.claim(
        case,
        image_sha256="0" * 64,
        image=PNG,
        source="mqtt",
        replica=first.replica,
        stale_after_s=60,
    )
    first.close()
    # and the device listening for its verdicts
    answered = threading.Event()

    def on_message(client, userdata, message) -> None:
        verdict = verdict_of(message.payload)
        if verdict is not None and verdict.case_id == case.case_id:
            answered.set()

    mqtt = MqttSettings(host=own_broker.host, port=own_broker.port)
    device = make_client(mqtt, device_client_id("cam-sw"))
    subscribed = threading.Event()
    device.on_message = on_message
    device.on_subscribe = lambda *a: subscribed.set()
    device.on_connect = lambda c, *a: c.subscribe("ef/v1/cam-sw/results", qos=1)
    connect(device, mqtt, clean_start=True)
    assert subscribed.wait(30)
    # when the replica starts again on the same data folder
    second = CloudServices.build(settings)
    try:
        second.start()
        # then its sweep answers the case, and the device gets the verdict
        assert answered.wait(30), "the swept case's verdict never reached the device"
    finally:
        second.close()
        device.loop_stop()
        device.disconnect()
