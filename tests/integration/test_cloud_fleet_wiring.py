"""The fleet inside the real cloud app: the model store behind NAME@VER deployments and
model downloads, and the dashboard's recent escalated cases with their images.

Real Mosquitto, uvicorn serving `edgefleet.cloud.app.create_app`, SQLite on disk; the route is the
rule-based level so no OCR model is loaded."""

from __future__ import annotations

import hashlib
import json
import queue
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import paho.mqtt.client as mqtt
import pytest
from typer.testing import CliRunner

from edgefleet.bench.harness import ServerThread, escalation_case
from edgefleet.bench.mosquitto import free_port
from edgefleet.cloud.app import create_app
from edgefleet.cloud.auth import key_digest
from edgefleet.cloud.services import CloudServices
from edgefleet.cloud.settings import CloudSettings
from edgefleet.fleet.cli import app as fleet_cli
from edgefleet.shared.imaging import encode_jpeg
from edgefleet.shared.messages import DesiredState
from edgefleet.shared.mqtt import MqttSettings, connect, from_paho, make_client
from edgefleet.shared.topics import Topics
from edgefleet.shared.wire import Verifier
from tests.support.fleet import tiny_onnx
from tests.support.waiting import eventually

OP_KEY = "op-wiring-key-" + "w" * 20
DEVICE = "cam-w1"


@dataclass
class Env:
    url: str
    data_dir: Path
    services: CloudServices
    token: str
    other_token: str
    desired: queue.Queue[DesiredState]
    device_client: mqtt.Client

    def op(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {OP_KEY}"}


@pytest.fixture(scope="module")
def env(broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("cloud-fleet-wiring")
    rules = tmp / "rules.yaml"
    rules.write_text("default: {model: rules, timeout_s: 30}\n")
    port = free_port()
    settings = CloudSettings(
        data_dir=tmp / "data",
        public_url=f"http://127.0.0.1:{port}",
        mqtt={"host": broker.host, "port": broker.port},
        ingest={"share_group": f"wiring-{secrets.token_hex(3)}"},
        api_keys=[{"name": "ops", "sha256": key_digest(OP_KEY)}],
        rules={"file": rules, "poll_s": 60},
        models={"preload": False},
    )
    app = create_app(settings)
    services: CloudServices = app.state.services
    cam = services.fleet_registry.enroll(DEVICE, group="dock")
    other = services.fleet_registry.enroll("cam-w2", group="yard")

    desired: queue.Queue[DesiredState] = queue.Queue()
    verifier = Verifier(key_for_device=lambda d: cam.device_key if d == DEVICE else None)

    def on_message(client, userdata, message) -> None:
        if message.payload:
            desired.put(verifier.verify(from_paho(message)).message)

    mqtt_settings = MqttSettings(host=broker.host, port=broker.port)
    device = make_client(mqtt_settings, f"{DEVICE}-{secrets.token_hex(3)}")
    device.on_message = on_message
    device.on_connect = lambda c, *a: c.subscribe(Topics().desired(DEVICE), qos=1)
    connect(device, mqtt_settings, clean_start=True)
    server = ServerThread(app, port=port).start()
    try:
        eventually(
            lambda: httpx.get(f"{server.url}/readyz", timeout=10).status_code == 200,
            60,
            "the cloud ready",
            detail=lambda: httpx.get(f"{server.url}/readyz", timeout=10).text,
            interval_s=0.1,
        )
        yield Env(server.url, settings.data_dir, services, cam.token, other.token, desired, device)
    finally:
        server.stop()
        device.loop_stop()
        device.disconnect()


def test_a_model_added_with_the_fleet_cli_deploys_by_name_and_downloads(
    env: Env, tmp_path: Path
) -> None:
    # given: an operator puts a model file in the store with the documented command,
    # which defaults to the same data_dir as the cloud
    model = tiny_onnx(tmp_path / "det.onnx")
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    added = CliRunner().invoke(
        fleet_cli,
        ["model-add", "det", "1.0", str(model)],
        env={"EDGEFLEET_FLEET_DATA_DIR": str(env.data_dir)},
    )
    assert added.exit_code == 0, added.output
    assert sha in added.output

    # when: a deployment names a version that is not in the store
    body = {"group": "dock", "image": "ghcr.io/acme/edge@sha256:" + "1" * 64, "soak_s": 0}
    missing = httpx.post(
        f"{env.url}/v1/deployments",
        json={**body, "models": [{"name": "det", "version": "9.9"}]},
        headers=env.op(),
        timeout=30,
    )
    # then: a typed 404, and the group is left without a rollout
    assert missing.status_code == 404, missing.text
    assert missing.json()["error"]["code"] == "model_not_found"

    # when: it names the stored one by name and version only
    created = httpx.post(
        f"{env.url}/v1/deployments",
        json={**body, "models": [{"name": "det", "version": "1.0"}]},
        headers=env.op(),
        timeout=30,
    )
    # then: the deployment carries the store's URL and hash ...
    assert created.status_code == 201, created.text
    [ref] = created.json()["models"]
    assert ref["url"] == f"{env.url}/v1/models/det/1.0"
    assert ref["sha256"] == sha
    # ... and the device gets a signed desired state with its own download link
    state = env.desired.get(timeout=30)
    assert state.deployment_id == created.json()["id"]
    [sent] = state.models
    assert sent.sha256 == sha
    assert sent.url.startswith(f"{env.url}/v1/models/det/1.0?device={DEVICE}&sig=")

    # the link alone downloads the file; so does the device's bearer token
    by_link = httpx.get(sent.url, timeout=30)
    assert by_link.status_code == 200, by_link.text
    assert hashlib.sha256(by_link.content).hexdigest() == sha
    by_token = httpx.get(ref["url"], headers={"Authorization": f"Bearer {env.token}"}, timeout=30)
    assert by_token.status_code == 200 and by_token.content == by_link.content

    # without credentials, or with a link made for another model, it is refused
    anonymous = httpx.get(ref["url"], timeout=30)
    assert anonymous.status_code == 401, anonymous.text
    assert set(anonymous.json()["error"]) >= {"code", "message", "trace_id"}
    forged = httpx.get(sent.url.replace("/det/1.0", "/det/9.9"), timeout=30)
    assert forged.status_code == 401  # refused before anything is looked up (no 404 probe)
    bad_sig = httpx.get(sent.url[:-4] + "0000", timeout=30)
    assert bad_sig.status_code == 401
    assert bad_sig.json()["error"]["code"] == "bad_capability"


def test_recent_cases_list_an_escalation_with_its_image(env: Env) -> None:
    # given: an escalation the device sent and the cloud answered
    image = np.full((64, 160, 3), 255, np.uint8)
    image[20:44, 20:140] = 0
    jpeg = encode_jpeg(image)
    case = escalation_case(DEVICE, content_type="image/jpeg", edge=[("DOCK-7", 0.9)])
    answered = httpx.post(
        f"{env.url}/v1/escalations",
        params={"wait": 30},
        files={"image": ("c.jpg", jpeg, "image/jpeg")},
        data={"metadata": json.dumps(case.model_dump(mode="json", by_alias=True))},
        headers={"Authorization": f"Bearer {env.token}"},
        timeout=60,
    )
    assert answered.status_code == 200, answered.text

    # when: the dashboard asks for the recent cases
    cases = httpx.get(f"{env.url}/v1/fleet/cases", headers=env.op(), timeout=30)
    # then: the case is there with its verdict and a same-origin image URL
    assert cases.status_code == 200, cases.text
    [listed] = [c for c in cases.json()["cases"] if c["case_id"] == case.case_id]
    assert listed["device_id"] == DEVICE
    assert listed["reason"] == case.reason
    assert listed["ts"].endswith("Z")
    assert listed["verdict"]["route"] == answered.json()["route"]
    assert [d["text"] for d in listed["verdict"]["result"]] == ["DOCK-7"]
    assert listed["image_url"] == f"/v1/escalations/{case.case_id}/image?device={case.device_id}"

    # and the image URL returns the JPEG to the operator and to the owning device
    for token in (OP_KEY, env.token):
        got = httpx.get(
            env.url + listed["image_url"],
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert got.status_code == 200, got.text
        assert got.headers["content-type"] == "image/jpeg"
        assert got.content == jpeg

    # but not to another device, nor without credentials, nor for an unknown case
    other = httpx.get(
        env.url + listed["image_url"],
        headers={"Authorization": f"Bearer {env.other_token}"},
        timeout=30,
    )
    # (another device's case is the same 404 as an unknown one: ids are per device)
    assert other.status_code == 404, other.text
    assert httpx.get(env.url + listed["image_url"], timeout=30).status_code == 401
    unknown = httpx.get(
        f"{env.url}/v1/escalations/no-such-case-0001/image", headers=env.op(), timeout=30
    )
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "not_found"
    assert httpx.get(f"{env.url}/v1/fleet/cases", timeout=30).status_code == 401


def test_drift_of_a_device_is_served_to_operators(env: Env) -> None:
    from datetime import datetime, timedelta, timezone

    from edgefleet.bench.harness import escalation_case as case_for

    # given: 25 sure cases of another device three weeks ago and 25 unsure ones now
    store = env.services.store
    old = datetime.now(timezone.utc) - timedelta(days=21)
    png = b"\x89PNG\r\n\x1a\n" + b"drift pixels"
    for i in range(50):
        case = case_for("cam-w2", frame_index=i, edge=[("X", 0.95 if i < 25 else 0.35)])
        store.ledger.claim(
            case, image_sha256="d" * 64, image=png, source="mqtt", replica="t", stale_after_s=60
        )
        if i < 25:
            store.db.execute(
                "UPDATE ef_cases SET received_at = ? WHERE case_id = ?", (old, case.case_id)
            )
    env.services.drift.compute()
    # when: an operator asks for the device's drift
    answer = httpx.get(
        f"{env.url}/v1/drift", params={"device_id": "cam-w2"}, headers=env.op(), timeout=30
    )
    # then: the KS statistic of this week against the reference window is there
    assert answer.status_code == 200, answer.text
    [reading] = answer.json()
    assert (reading["device_id"], reading["model"], reading["ks"]) == ("cam-w2", "ppocr", 1.0)
    assert (reading["current_n"], reading["reference_n"]) == (25, 25)
    assert reading["computed_at"].endswith("Z")
    # and the device view of the fleet shows the same reading
    view = httpx.get(f"{env.url}/v1/devices/cam-w2", headers=env.op(), timeout=30)
    assert view.status_code == 200, view.text
    assert view.json()["drift"] == [reading]
    # and it is an operator's view: a device token may not read it
    denied = httpx.get(
        f"{env.url}/v1/drift", headers={"Authorization": f"Bearer {env.token}"}, timeout=30
    )
    assert denied.status_code == 403
