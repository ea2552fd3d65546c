"""The cloud's primary model on a real Triton Inference Server (nvidia-pytriton's
tritonserver 2.51, its Python backend running ONNX Runtime on the CPU), serving the
repository `cloud triton-repo --backend python` wrote from the manifest.

Escalations come through the real broker and are answered by the primary on Triton with
the texts the same pipeline reads in process; with Triton killed (SIGKILL) the same kind of
cases are answered by the lighter in-process model, counted, with /readyz saying why; after
Triton's restart the primary answers again, without restarting the cloud. Every case is
answered exactly once throughout.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import cv2
import httpx
import numpy as np
import pytest
import yaml

from edgefleet.bench.harness import ServerThread, escalation_case, escalation_wire, verdict_of
from edgefleet.bench.triton_server import TritonServer
from edgefleet.cloud.app import create_app
from edgefleet.cloud.services import CloudServices
from edgefleet.cloud.settings import CloudSettings
from edgefleet.cloud.triton.repository import RepositoryOptions, write_repository
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.shared.db import Database
from edgefleet.shared.imaging import encode_png
from edgefleet.shared.messages import CloudVerdict
from edgefleet.shared.models import ModelRegistry, load_model
from edgefleet.shared.mqtt import MqttSettings, connect, make_client, publish
from tests.support.waiting import counter_value, eventually

PRIMARY, LIGHTER = "ppocr6-cloud", "ppocr6-tiny"
DEVICE = "cam-triton"
PER_PHASE = 3


def _scene(i: int) -> np.ndarray:
    """A white plate with its own text, so no case is answered from the verdict cache."""
    img = np.full((96, 420, 3), 255, np.uint8)
    cv2.putText(img, f"TRI-{i:02d}7", (12, 66), cv2.FONT_HERSHEY_SIMPLEX, 1.8, (0, 0, 0), 4)
    return img


def _manifest(path: Path, url: str) -> Path:
    """The operator's manifest: the primary pipeline as built in, served by Triton."""
    spec = ModelRegistry.default().get(PRIMARY)
    entry = spec.model_dump(mode="json", exclude={"base_dir"}, exclude_none=True)
    entry["triton"] = {"url": url, "protocol": "grpc", "connect_timeout_s": 1}
    path.write_text(yaml.safe_dump({"models": [entry]}))
    return path


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    work = tmp_path_factory.mktemp("triton")
    options = RepositoryOptions(backend="python", kind="cpu", max_batch_size=16)
    write_repository(work / "repo", ModelRegistry.default(), [PRIMARY], options)
    server = TritonServer(work / "repo", work).start()
    yield server
    server.kill()


class Verdicts:
    """The device's results topic: every verdict, counted per case."""

    def __init__(self) -> None:
        self.by_case: dict[str, list[CloudVerdict]] = {}
        self._lock = threading.Lock()

    def on_message(self, client, userdata, message) -> None:
        verdict = verdict_of(message.payload)
        if verdict is not None:
            with self._lock:
                self.by_case.setdefault(verdict.case_id, []).append(verdict)

    def of(self, case_ids: list[str]) -> list[CloudVerdict]:
        eventually(lambda: all(c in self.by_case for c in case_ids), 180, "every case answered")
        return [self.by_case[c][0] for c in case_ids]


@pytest.mark.slow
def test_primary_on_triton_falls_back_when_killed_and_returns_on_restart(
    broker, triton: TritonServer, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    db = Database.connect(f"sqlite:///{data / 'cloud.db'}")
    cam = DeviceRegistry(db).enroll(DEVICE)
    db.close()
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"default: {{model: {PRIMARY}, timeout_s: 60}}\n")
    settings = CloudSettings(
        data_dir=data,
        mqtt=MqttSettings(host=broker.host, port=broker.port),
        ingest={"client_id": "triton-cloud"},
        rules={"file": rules},
        models={
            "primary": PRIMARY,
            "lighter": LIGHTER,
            "served": [PRIMARY, LIGHTER],
            "manifest": _manifest(tmp_path / "manifest.yaml", triton.grpc_url),
        },
        queue={"workers": 1},
    )
    services = CloudServices.build(settings)
    server = ServerThread(create_app(settings, services=services)).start()
    verdicts = Verdicts()
    mqtt = MqttSettings(host=broker.host, port=broker.port)
    device = make_client(mqtt, f"{DEVICE}-device")
    subscribed = threading.Event()
    device.on_message = verdicts.on_message
    device.on_subscribe = lambda *a: subscribed.set()
    device.on_connect = lambda c, *a: c.subscribe(f"ef/v1/{DEVICE}/results", qos=1)
    connect(device, mqtt, clean_start=True)
    in_process = {name: load_model(name) for name in (PRIMARY, LIGHTER)}
    scenes = iter(range(100))

    def send(n: int) -> tuple[list[str], list[list[str]]]:
        """n cases, each its own image: their ids and what each model reads in process."""
        ids, images = [], []
        for _ in range(n):
            image = _scene(next(scenes))
            case = escalation_case(DEVICE, edge=[("X", 0.3)])
            png = encode_png(image)
            publish(device, escalation_wire(case, cam.device_key, png), qos=1).wait_for_publish(30)
            ids.append(case.case_id)
            images.append(image)
        return ids, images

    def texts(model: str, images: list[np.ndarray]) -> list[list[str]]:
        return [[d.text for d in in_process[model].predict(img)] for img in images]

    try:
        eventually(lambda: services.pool.loaded(PRIMARY) is not None, 180, "primary loaded")
        assert services.ingest is not None and services.ingest.wait_connected(30)
        assert subscribed.wait(30)
        ready = httpx.get(f"{server.url}/readyz", timeout=10).json()
        assert {m["name"]: m["backend"] for m in ready["models"]}[PRIMARY] == "triton"
        assert {t["model"] for t in ready["triton"]} == {"ppocr6-small-det", "ppocr6-small-rec"}
        assert all(t["model_ready"] and t["reason"] is None for t in ready["triton"])

        # given Triton up: the primary answers on it, reading what it reads in process
        ids, images = send(PER_PHASE)
        got = verdicts.of(ids)
        assert [(v.model, v.fallback_level) for v in got] == [(f"{PRIMARY}@6.0", 0)] * PER_PHASE
        assert [[d.text for d in v.result] for v in got] == texts(PRIMARY, images)
        assert any(t for t in texts(PRIMARY, images)), "nothing read: the test shows nothing"
        ok_calls = counter_value("ef_triton_calls_total", model="ppocr6-small-rec", outcome="ok")
        assert ok_calls > 0

        # when Triton is killed: the same kind of cases go to the lighter in-process model
        triton.kill()
        failed_before = counter_value(
            "ef_cloud_model_failures_total", model=PRIMARY, reason="triton_unavailable"
        )
        ids, images = send(PER_PHASE)
        got = verdicts.of(ids)
        assert [(v.model, v.fallback_level) for v in got] == [(f"{LIGHTER}@6.0", 1)] * PER_PHASE
        assert [[d.text for d in v.result] for v in got] == texts(LIGHTER, images)
        failed = counter_value(
            "ef_cloud_model_failures_total", model=PRIMARY, reason="triton_unavailable"
        )
        assert failed - failed_before == PER_PHASE  # each counted
        assert (
            counter_value("ef_triton_calls_total", model="ppocr6-small-det", outcome="unavailable")
            >= PER_PHASE
        )
        # and /readyz says why, still ready: the fallback chain answers
        response = httpx.get(f"{server.url}/readyz", timeout=30)
        assert response.status_code == 200
        body = response.json()
        assert body["degraded"] and all(not t["server_ready"] for t in body["triton"])
        assert all(t["reason"] for t in body["triton"])

        # then after Triton's restart the primary answers again, the cloud untouched
        triton.start()
        eventually(
            lambda: all(
                t["model_ready"] for t in httpx.get(f"{server.url}/readyz").json()["triton"]
            ),
            60,
            "readyz sees Triton back",
        )
        ids, images = send(PER_PHASE)
        got = verdicts.of(ids)
        assert [(v.model, v.fallback_level) for v in got] == [(f"{PRIMARY}@6.0", 0)] * PER_PHASE
        assert [[d.text for d in v.result] for v in got] == texts(PRIMARY, images)

        # none lost, none answered twice
        assert len(verdicts.by_case) == 3 * PER_PHASE
        assert all(len(v) == 1 for v in verdicts.by_case.values())
        assert (
            'ef_triton_call_seconds_count{model="ppocr6-small-det"}'
            in httpx.get(f"{server.url}/metrics").text
        )
    finally:
        device.loop_stop()
        device.disconnect()
        server.stop()
        services.close()
        for model in in_process.values():
            model.close()
