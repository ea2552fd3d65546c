"""The scale path as docker/x86/k8s runs it: two orchestrator replicas sharing one broker
(a shared subscription), one PostgreSQL store and one data folder (the ReadWriteMany
claim of pvc.yaml, where the case images lie).

Load splits between the replicas, every case gets exactly one verdict, the store ran each
case exactly once, and either replica answers for a case the other processed. Cases go to
the rule-based level (a rules file) so the test measures the ingest and claim path, not OCR.
"""

from __future__ import annotations

import secrets
import threading
from pathlib import Path

import httpx
import numpy as np

from edgefleet.bench.harness import ServerThread, publish_cases, verdict_of
from edgefleet.cloud.app import create_app
from edgefleet.cloud.auth import key_digest
from edgefleet.cloud.services import CloudServices
from edgefleet.cloud.settings import CloudSettings
from edgefleet.shared.db import Database
from edgefleet.shared.imaging import encode_png
from edgefleet.shared.mqtt import MqttSettings, connect, make_client
from tests.support.waiting import counter_value, eventually


def _escalations(outcome: str) -> float:
    """Cases the ingest took in with `outcome`, all replicas of this process together."""
    return counter_value("ef_cloud_ingest_total", channel="escalations", outcome=outcome)


N_CASES = 300


OPERATOR_KEY = "efk_" + secrets.token_urlsafe(16)


def _replica(data: Path, pg: str, broker, group: str, name: str, rules: Path) -> CloudSettings:
    return CloudSettings(
        data_dir=data,
        database_url=pg,
        api_keys=[{"name": "ops", "sha256": key_digest(OPERATOR_KEY)}],
        mqtt=MqttSettings(host=broker.host, port=broker.port),
        ingest={"share_group": group, "client_id": name, "receive_maximum": 32},
        rules={"file": rules, "poll_s": 60},
        models={"preload": False},
        queue={"workers": 3},
    )


def test_two_replicas_on_postgresql_split_the_load_exactly_once(
    broker,
    pg_url: str,
    tmp_path: Path,
) -> None:
    # given two replicas on one broker, one PostgreSQL and one shared data folder
    rules = tmp_path / "rules.yaml"
    rules.write_text("default: {model: rules, timeout_s: 30}\n")
    group = f"scale-{secrets.token_hex(3)}"
    # client ids of this test only: a session of the same id left by another test would
    # resume with that test's group subscription and take every case a second time
    names = [f"{group}-{i}" for i in range(2)]
    settings = [_replica(tmp_path / "data", pg_url, broker, group, n, rules) for n in names]
    replicas = [CloudServices.build(s) for s in settings]
    servers = [
        ServerThread(create_app(s, services=r)) for s, r in zip(settings, replicas, strict=True)
    ]
    cam = replicas[0].registry.enroll("cam-scale")
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
    device = make_client(mqtt_settings, f"cam-scale-{secrets.token_hex(3)}")
    subscribed = threading.Event()
    device.on_message = on_message
    device.on_subscribe = lambda *a: subscribed.set()
    device.on_connect = lambda c, *a: c.subscribe("ef/v1/cam-scale/results", qos=1)
    connect(device, mqtt_settings, clean_start=True)
    db = Database.connect(pg_url)
    try:
        for server in servers:
            server.start()
        for replica in replicas:
            assert replica.ingest is not None and replica.ingest.wait_connected(30)
        # and both are ready on the shared store, as the Service's readiness probe asks
        for server in servers:
            ready = httpx.get(f"{server.url}/readyz", timeout=10)
            assert ready.status_code == 200, ready.text
            assert ready.json()["store"] == {"dialect": "postgresql", "writable": True}
        assert subscribed.wait(30)
        # when the device escalates N cases
        png = encode_png(np.full((8, 8, 3), 200, np.uint8))
        stored_before, replayed_before = _escalations("stored"), _escalations("replayed")
        case_ids = publish_cases(device, "cam-scale", cam.device_key, N_CASES, png)
        # then every case gets exactly one verdict on the results topic
        assert done.wait(120), f"only {len(seen)} of {N_CASES} verdicts arrived"
        # a second verdict needs a second delivery of its case: every case was taken in once
        eventually(lambda: _escalations("stored") - stored_before == N_CASES, 60, "all stored")
        assert _escalations("replayed") == replayed_before
        assert set(seen) == set(case_ids)
        assert all(count == 1 for count in seen.values())
        # and PostgreSQL ran each case exactly once, split between the two replicas
        attempts = replicas[1].store.ledger.attempts()
        assert len(attempts) == N_CASES and set(attempts.values()) == {1}
        rows = db.query("SELECT processed_by, COUNT(*) AS n FROM ef_verdicts GROUP BY processed_by")
        per_replica = {row["processed_by"]: row["n"] for row in rows}
        assert set(per_replica) == set(names), per_replica
        assert sum(per_replica.values()) == N_CASES
        # and behind the Service either replica answers for any case, image included
        by = {
            row["case_id"]: row["processed_by"]
            for row in db.query("SELECT case_id, processed_by FROM ef_verdicts")
        }
        auth = {"Authorization": f"Bearer {OPERATOR_KEY}"}
        for owner in names:
            case_id = next(c for c, p in by.items() if p == owner)
            for server in servers:
                record = httpx.get(f"{server.url}/v1/escalations/{case_id}", headers=auth)
                assert record.status_code == 200 and record.json()["verdict"], record.text
                image = httpx.get(f"{server.url}/v1/escalations/{case_id}/image", headers=auth)
                assert image.status_code == 200 and image.content == png
    finally:
        device.loop_stop()
        device.disconnect()
        for server in servers:
            server.stop()
        for replica in replicas:
            replica.close()
        db.close()
