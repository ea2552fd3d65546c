"""Two orchestrator replicas on one broker split the load through a shared subscription:
1,000 cases, none processed twice, none lost. Cases are routed to the rule-based level
(a rules file) so the test measures the ingest path, not OCR."""

from __future__ import annotations

import secrets
import threading
from pathlib import Path

import numpy as np

from edgefleet.bench.harness import publish_cases, verdict_of
from edgefleet.cloud.services import CloudServices
from edgefleet.cloud.settings import CloudSettings
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.shared.db import Database
from edgefleet.shared.imaging import encode_png
from edgefleet.shared.mqtt import MqttSettings, connect, make_client
from tests.support.waiting import counter_value, eventually


def _escalations(outcome: str) -> float:
    """Cases the ingest took in with `outcome`, all replicas of this process together."""
    return counter_value("ef_cloud_ingest_total", channel="escalations", outcome=outcome)


N_CASES = 1000


def _replica(tmp: Path, broker, group: str, name: str, rules: Path) -> CloudServices:
    settings = CloudSettings(
        data_dir=tmp,
        mqtt=MqttSettings(host=broker.host, port=broker.port),
        ingest={"share_group": group, "client_id": name, "receive_maximum": 32},
        rules={"file": rules, "poll_s": 60},
        models={"preload": False},
        queue={"workers": 3},
    )
    return CloudServices.build(settings)


def test_two_replicas_split_a_thousand_cases_exactly_once(broker, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("default: {model: rules, timeout_s: 30}\n")
    data = tmp_path / "data"
    db = Database.connect(f"sqlite:///{data / 'cloud.db'}")
    cam = DeviceRegistry(db).enroll("cam-r1")
    group = f"rep-{secrets.token_hex(3)}"
    # client ids of this test only: a session of the same id left by another test would
    # resume with that test's group subscription and take every case a second time
    names = [f"{group}-{i}" for i in range(2)]
    replicas = [_replica(data, broker, group, name, rules) for name in names]
    seen: dict[str, int] = {}
    lock = threading.Lock()
    done = threading.Event()

    def on_message(client, userdata, message):
        verdict = verdict_of(message.payload)
        if verdict is None:  # the cloud's lag status
            return
        with lock:
            seen[verdict.case_id] = seen.get(verdict.case_id, 0) + 1
            if len(seen) >= N_CASES:
                done.set()

    mqtt_settings = MqttSettings(host=broker.host, port=broker.port)
    device = make_client(mqtt_settings, "cam-r1-device")
    subscribed = threading.Event()
    device.on_message = on_message
    device.on_subscribe = lambda *a: subscribed.set()
    device.on_connect = lambda c, *a: c.subscribe("ef/v1/cam-r1/results", qos=1)
    connect(device, mqtt_settings, clean_start=True)
    try:
        for replica in replicas:
            replica.start()
        for replica in replicas:
            assert replica.ingest is not None and replica.ingest.wait_connected(30)
        assert subscribed.wait(30)
        png = encode_png(np.full((8, 8, 3), 200, np.uint8))
        stored_before, replayed_before = _escalations("stored"), _escalations("replayed")
        case_ids = publish_cases(device, "cam-r1", cam.device_key, N_CASES, png)
        # then every case gets exactly one verdict on the results topic
        assert done.wait(240), f"only {len(seen)} of {N_CASES} verdicts arrived"
        # a second verdict needs a second delivery of its case: every case was taken in once
        eventually(lambda: _escalations("stored") - stored_before == N_CASES, 60, "all stored")
        assert _escalations("replayed") == replayed_before
        assert set(seen) == set(case_ids)
        assert all(count == 1 for count in seen.values())
        # and the store ran each case exactly once, split between the two replicas
        attempts = replicas[0].store.ledger.attempts()
        assert len(attempts) == N_CASES and set(attempts.values()) == {1}
        split = db.query(
            "SELECT processed_by, COUNT(*) AS n FROM ef_verdicts GROUP BY processed_by"
        )
        per_replica = {row["processed_by"]: row["n"] for row in split}
        assert set(per_replica) == set(names), per_replica
        assert sum(per_replica.values()) == N_CASES
    finally:
        device.loop_stop()
        device.disconnect()
        for replica in replicas:
            replica.close()
        db.close()
