"""A primary model that hangs: escalations fall back (recorded as fallback_level), the
synchronous /v1/infer answers 504 (it has no fallback), and a full queue answers 429."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import cv2
import httpx
import numpy as np
import pytest

from edgefleet.bench.harness import ServerThread, escalation_case
from edgefleet.cloud.app import create_app
from edgefleet.cloud.auth import key_digest
from edgefleet.cloud.services import CloudServices
from edgefleet.cloud.settings import CloudSettings
from edgefleet.shared.executor import BatcherSettings, DynamicBatcher
from edgefleet.shared.imaging import encode_png
from edgefleet.shared.messages import Detection, ModelInfo
from edgefleet.shared.models import load_model
from tests.support.waiting import eventually

OP_KEY = "op-fallback-key-0123456789"


class HangingModel:
    """Stands in for a model whose runtime wedges: behind a real scheduler (the batcher),
    its forward pass blocks until the model is closed."""

    def __init__(self) -> None:
        self.info = ModelInfo(
            name="ppocr-heavy", version="hang", sha256="0" * 64, backend="hand-written"
        )
        self.release = threading.Event()
        self.calls = 0
        self.priorities: list[int] = []  # of each call, as it reached the scheduler
        self.scheduler = DynamicBatcher(
            self._forward, BatcherSettings(max_delay_ms=0), name="hanging-fallback"
        ).start()

    def _forward(self, images: list[np.ndarray]) -> list[list[Detection]]:
        self.calls += len(images)
        self.release.wait()
        return [[] for _ in images]

    def predict(self, image_rgb, *, priority=0, timeout_s=None, tenant=None) -> list[Detection]:
        self.priorities.append(priority)
        return self.scheduler.submit(image_rgb, priority=priority, timeout_s=timeout_s).result()

    async def predict_async(
        self, image_rgb, *, priority=0, timeout_s=None, tenant=None
    ) -> list[Detection]:
        self.priorities.append(priority)
        return await self.scheduler.submit(image_rgb, priority=priority, timeout_s=timeout_s)

    @property
    def memory_bytes(self) -> int:
        return 1

    def close(self) -> None:
        self.release.set()
        self.scheduler.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, CloudServices]]:
    tmp: Path = tmp_path_factory.mktemp("cloud-fallback")
    rules = tmp / "rules.yaml"
    rules.write_text(
        "default: {model: ppocr-heavy, timeout_s: 1.5}\n"
        "rules:\n"
        "  - name: strict\n"
        "    when: {stream: strict}\n"
        "    route: {model: ppocr-heavy, timeout_s: 1, fallback: false}\n"
    )
    settings = CloudSettings(
        data_dir=tmp / "data",
        ingest={"enabled": False},
        api_keys=[{"name": "ops", "sha256": key_digest(OP_KEY)}],
        rules={"file": rules},
        queue={"workers": 1, "max_pending": 2, "retry_after_s": 2},
        models={
            "primary": "ppocr-heavy",
            "lighter": "ppocr",
            "served": ["ppocr-heavy", "ppocr"],
            "infer_priority": 3,
        },
    )
    hanging = HangingModel()

    def loader(name: str):
        return hanging if name == "ppocr-heavy" else load_model(name)

    services = CloudServices.build(settings, loader=loader)
    services.fleet_registry.enroll("cam-f1")
    app = create_app(settings, services=services)
    srv = ServerThread(app).start()
    try:
        yield srv.url, services
    finally:
        hanging.release.set()
        srv.stop()
        services.close()


def _png() -> bytes:
    img = np.full((96, 400, 3), 255, np.uint8)
    cv2.putText(img, "FALL-1", (10, 65), cv2.FONT_HERSHEY_SIMPLEX, 1.8, (0, 0, 0), 4)
    return encode_png(img)


def _escalate(url: str, wait: float | None, stream: str = "cam") -> httpx.Response:
    case = escalation_case("cam-f1", stream_id=stream, edge=[("FALL-I", 0.7)])
    return httpx.post(
        f"{url}/v1/escalations",
        params={"wait": wait} if wait else {},
        files={"image": ("c.png", _png(), "image/png")},
        data={"metadata": json.dumps(case.model_dump(mode="json", by_alias=True))},
        headers={"Authorization": f"Bearer {OP_KEY}"},
        timeout=60,
    )


def test_hanging_primary_falls_back_to_the_lighter_model(server) -> None:
    url, services = server
    response = _escalate(url, wait=30)
    assert response.status_code == 200, response.text
    verdict = response.json()
    assert verdict["fallback_level"] == 1 and verdict["model"] == "ppocr@4.0"
    assert [d["text"] for d in verdict["result"]] == ["FALL-1"]
    # and the fallback is recorded on the case and counted
    record = services.store.lookup.case(verdict["case_id"])
    assert record["verdict"]["fallback_level"] == 1
    metrics = httpx.get(f"{url}/metrics").text
    assert 'ef_cloud_fallback_level_total{level="lighter"}' in metrics
    assert 'ef_cloud_model_failures_total{model="ppocr-heavy",reason="timeout"}' in metrics


def test_route_without_fallback_answers_busy(server) -> None:
    url, _ = server
    verdict = _escalate(url, wait=30, stream="strict").json()
    assert verdict["fallback_level"] == 3 and verdict["model"] == "busy" and verdict["result"] == []


def test_infer_has_no_fallback_so_a_hang_is_a_504(server) -> None:
    url, services = server
    hanging = services.pool.get("ppocr-heavy")
    assert isinstance(hanging, HangingModel)
    before = len(hanging.priorities)
    response = httpx.post(
        f"{url}/v1/infer/ppocr-heavy",
        params={"timeout_s": 1},
        content=_png(),
        headers={"Authorization": f"Bearer {OP_KEY}", "Content-Type": "image/png"},
        timeout=30,
    )
    assert response.status_code == 504
    # it waited in the model's queue at models.infer_priority, not at a route's priority
    assert hanging.priorities[before:] == [3]
    assert response.json()["error"]["code"] == "inference_timeout"
    # the lighter model on the same server still answers
    ok = httpx.post(
        f"{url}/v1/infer/ppocr",
        content=_png(),
        headers={"Authorization": f"Bearer {OP_KEY}", "Content-Type": "image/png"},
        timeout=60,
    )
    assert ok.status_code == 200


def test_oversize_multipart_escalation_streamed_without_length_is_a_413(server) -> None:
    url, services = server
    limit = services.settings.http.max_upload_bytes
    case = escalation_case("cam-f1")
    meta = json.dumps(case.model_dump(mode="json", by_alias=True)).encode()

    def body():  # chunked (no Content-Length): only counting the stream can stop it
        yield (
            b'--xx\r\nContent-Disposition: form-data; name="metadata"\r\n\r\n' + meta + b"\r\n"
            b'--xx\r\nContent-Disposition: form-data; name="image"; filename="c.png"\r\n'
            b"Content-Type: image/png\r\n\r\n\x89PNG\r\n\x1a\n"
        )
        for _ in range(limit // 65_536 + 8):
            yield b"\0" * 65_536
        yield b"\r\n--xx--\r\n"

    response = httpx.post(
        f"{url}/v1/escalations",
        content=body(),
        headers={
            "Authorization": f"Bearer {OP_KEY}",
            "Content-Type": "multipart/form-data; boundary=xx",
        },
        timeout=60,
    )
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "payload_too_large" and len(error["trace_id"]) == 32
    assert services.store.lookup.case_device(case.case_id) is None  # nothing stored
    assert httpx.get(f"{url}/healthz").status_code == 200


def test_wait_that_runs_out_is_a_202_and_the_verdict_comes_later(server) -> None:
    url, _ = server
    # given a primary that hangs for the route's 1.5 s, when the client waits only 0.2 s
    response = _escalate(url, wait=0.2)
    # then it gets a 202 saying the case is still processing, not an error
    assert response.status_code == 202, response.text
    accepted = response.json()
    assert accepted["status"] == "processing" and len(accepted["trace_id"]) == 32
    # and the verdict (from the fallback) is there to fetch once it is made
    records: list[dict] = []

    def answered() -> bool:
        records[:] = [
            httpx.get(
                f"{url}/v1/escalations/{accepted['case_id']}",
                headers={"Authorization": f"Bearer {OP_KEY}"},
                timeout=30,
            ).json()
        ]
        return records[0]["verdict"] is not None

    eventually(answered, 60, "the case's verdict stored", detail=lambda: records, interval_s=0.1)
    assert records[0]["verdict"]["fallback_level"] == 1


def test_full_queue_answers_429_with_retry_after(server) -> None:
    url, services = server
    # given one worker stuck for 1.5 s per case and room for 2 waiting cases
    statuses = []
    for _ in range(8):
        response = _escalate(url, wait=None)
        statuses.append(response.status_code)
        if response.status_code == 429:
            assert response.headers["Retry-After"] == "2"
            assert response.json()["error"]["code"] == "overloaded"
            break
    assert 429 in statuses, statuses
    # and once the queue drains, cases are accepted again
    eventually(
        lambda: services.processor.depth == 0,
        60,
        "the queue drained",
        detail=lambda: services.processor.depth,
    )
    assert _escalate(url, wait=None).status_code == 202
