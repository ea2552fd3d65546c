"""One device's dense-text flood must not hold the shared model (#32, finding 4).

A real `edgefleet cloud serve` (uvicorn, the shipped app and settings, the real PP-OCR
cloud model): cam-a escalates eight images dense with text and sends six `/v1/infer`
calls of the same image, then cam-b escalates one simple crop. cam-b's case is answered by
the primary model within its route's deadline: at the model's scheduler each batch holds
one request per device, devices take turns, and a dense image costs the model a bounded
number of lines (the rest counted and noted on cam-a's verdicts as `lines_unread`)."""

from __future__ import annotations

import json
import random
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import httpx
import numpy as np
import pytest

from edgefleet.bench.harness import escalation_case
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.shared.db import Database
from edgefleet.shared.imaging import encode_png
from edgefleet.shared.messages import CloudVerdict
from tests.integration.test_cloud_api import TEXT, text_image
from tests.integration.test_cloud_crash import _ready, _serve
from tests.support.waiting import eventually

ROUTE_TIMEOUT_S = 20.0  # models.timeout_s: the default route's deadline


def dense_text(width: int = 480, height: int = 320) -> np.ndarray:
    """A page of small words, one every 90 px, a row every 16 px (about 95 lines)."""
    rng = random.Random(32)
    img = np.full((height, width, 3), 255, np.uint8)
    for y in range(14, height - 4, 16):
        for x in range(4, width - 80, 90):
            word = "".join(rng.choice("ABCDEFHKLMNPRSTUXYZ0123456789") for _ in range(5))
            cv2.putText(img, word, (x, y), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1)
    return img


@pytest.mark.slow
def test_a_dense_text_flood_leaves_another_device_the_primary_model(tmp_path: Path) -> None:
    data = tmp_path / "data"
    db = Database.connect(f"sqlite:///{data / 'cloud.db'}")
    registry = DeviceRegistry(db)
    cam_a, cam_b = registry.enroll("cam-a"), registry.enroll("cam-b")
    db.close()
    config = tmp_path / "cloud.yaml"
    config.write_text(
        json.dumps({"http": {"port": 0}, "ingest": {"enabled": False}, "data_dir": str(data)})
    )
    log = tmp_path / "serve.log"
    dense = encode_png(dense_text())
    cloud = _serve(config, log)
    pool = ThreadPoolExecutor(8)
    try:
        _ready(log, cloud)
        url = "http://127.0.0.1:" + re.findall(r"serving on 127\.0\.0\.1:(\d+)", log.read_text())[0]
        client = httpx.Client(base_url=url, timeout=120)

        def escalate(token: str, device: str, image: bytes, wait: float | None) -> httpx.Response:
            case = escalation_case(device, edge=[("EF-2O48", 0.41)])
            return client.post(
                "/v1/escalations",
                params={"wait": wait} if wait else {},
                files={"image": ("crop.png", image, "image/png")},
                data={"metadata": json.dumps(case.model_dump(mode="json", by_alias=True))},
                headers={"Authorization": f"Bearer {token}"},
            )

        def infer() -> httpx.Response:
            return client.post(
                "/v1/infer/ppocr6-cloud",
                content=dense,
                headers={"Authorization": f"Bearer {cam_a.token}", "Content-Type": "image/png"},
            )

        def model_queue() -> float:
            metrics = client.get("/metrics").text
            return sum(
                float(v)
                for v in re.findall(
                    r'^ef_batcher_queue_depth\{batcher="ppocr6-cloud",priority="0"\} (\S+)$',
                    metrics,
                    re.M,
                )
            )

        # given cam-a's flood: eight dense escalations and six /v1/infer calls of the image
        flood = [pool.submit(escalate, cam_a.token, "cam-a", dense, None) for _ in range(8)]
        accepted = [f.result() for f in flood]
        assert all(r.status_code == 202 for r in accepted), [r.text for r in accepted]
        calls = [pool.submit(infer) for _ in range(6)]
        # holding the model: cam-a's requests wait in its queue
        eventually(lambda: model_queue() >= 3, 60, "cam-a's requests queued at the model")
        # when cam-b sends one simple case
        answered = escalate(cam_b.token, "cam-b", encode_png(text_image()), 60)
        # then the primary model answered it within its deadline
        assert answered.status_code == 200, answered.text
        verdict = CloudVerdict.model_validate_json(answered.text)
        assert (verdict.model, verdict.fallback_level) == ("ppocr6-cloud@6.0", 0)
        assert [d.text for d in verdict.result] == [TEXT]
        assert verdict.latency_ms < ROUTE_TIMEOUT_S * 1000 and verdict.lines_unread is None
        # and cam-a's dense images were read up to the line cap, the rest noted
        first = accepted[0].json()["case_id"]
        auth = {"Authorization": f"Bearer {cam_a.token}"}

        def dense_verdict() -> dict | None:
            return client.get(f"/v1/escalations/{first}", headers=auth).json()["verdict"]

        eventually(dense_verdict, 60, "cam-a's first dense case answered")
        noted = dense_verdict()
        assert noted is not None and noted["fallback_level"] == 0
        assert noted["lines_unread"] >= 1 and len(noted["result"]) <= 24
        unread = re.search(
            r'^ef_ocr_lines_unread_total\{model="ppocr6-cloud"\} (\S+)$',
            client.get("/metrics").text,
            re.M,
        )
        assert unread and float(unread.group(1)) >= noted["lines_unread"]
        assert not any(call.done() and call.result().status_code >= 500 for call in calls)
    finally:
        cloud.terminate()
        try:
            cloud.wait(30)
        except subprocess.TimeoutExpired:  # still busy with the flood: it is only a test
            cloud.kill()
            cloud.wait(30)
        pool.shutdown(cancel_futures=True)  # the flood's calls end with the server
