"""A few tiny images must not take the cloud's memory to gigabytes (#32, finding 3).

A real `edgefleet cloud serve` (uvicorn, the shipped app, the real PP-OCR models) and the
outside test's flood: 16 concurrent `/v1/infer` calls from cam-a, each a few kilobytes
that declare hundreds of megabytes of pixels (JPEGs whose frame header lies about the size,
16-bit RGBA PNGs of zeros), while cam-b's escalation is answered by the primary model.
The server's RSS, sampled through the flood, stays under 1 GB; every bomb gets a typed
answer (413 before decoding, 503 + Retry-After while the decode budget is full, or a
result); and once it is over the budget is all given back (no decoded pixels linger)."""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from edgefleet.bench.harness import escalation_case
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.shared.db import Database
from edgefleet.shared.imaging import encode_png
from edgefleet.shared.messages import CloudVerdict
from tests.integration.test_cloud_api import TEXT, text_image
from tests.integration.test_cloud_crash import _ready, _serve
from tests.support.bombs import jpeg_declaring, rgba16_png
from tests.support.waiting import eventually

GB = 1 << 30
BOMBS = 16


class PeakRss:
    """The process's resident memory, sampled in a thread until stopped."""

    def __init__(self, pid: int):
        self._process = psutil.Process(pid)
        self._stop = threading.Event()
        self.peak = 0
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, self._process.memory_info().rss)
            if self._stop.wait(0.01):
                return

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.mark.slow
def test_sixteen_declared_dimension_bombs_stay_under_a_gigabyte(tmp_path: Path) -> None:
    data = tmp_path / "data"
    db = Database.connect(f"sqlite:///{data / 'cloud.db'}")
    registry = DeviceRegistry(db)
    cam_a, cam_b = registry.enroll("cam-a"), registry.enroll("cam-b")
    db.close()
    rules = tmp_path / "rules.yaml"
    rules.write_text("default: {model: ppocr6-cloud, timeout_s: 60}\n")
    config = tmp_path / "cloud.yaml"
    config.write_text(
        json.dumps(
            {
                "http": {"port": 0},
                "ingest": {"enabled": False},
                "data_dir": str(data),
                "rules": {"file": str(rules)},
                "execution": {"batching": {"max_delay_ms": 2}},
            }
        )
    )  # the image limits are the shipped defaults
    log = tmp_path / "serve.log"
    # given bombs of a few kilobytes each: 16.8 MP of JPEG, 14.7 MP of 16-bit RGBA
    jpeg, png = jpeg_declaring(4096, 4096), rgba16_png(3840, 3840)
    assert len(jpeg) < 1024 and len(png) < 512 * 1024
    cloud = _serve(config, log)
    try:
        _ready(log, cloud)
        url = "http://127.0.0.1:" + re.findall(r"serving on 127\.0\.0\.1:(\d+)", log.read_text())[0]
        client = httpx.Client(base_url=url, timeout=120)

        def bomb(i: int) -> httpx.Response:
            body, kind = (jpeg, "image/jpeg") if i % 2 else (png, "image/png")
            return client.post(
                "/v1/infer/ppocr6-cloud",
                content=body,
                headers={"Authorization": f"Bearer {cam_a.token}", "Content-Type": kind},
            )

        def cam_b_case() -> httpx.Response:
            case = escalation_case("cam-b", edge=[("EF-2O48", 0.41)])
            return client.post(
                "/v1/escalations",
                params={"wait": 60},
                files={"image": ("crop.png", encode_png(text_image()), "image/png")},
                data={"metadata": json.dumps(case.model_dump(mode="json", by_alias=True))},
                headers={"Authorization": f"Bearer {cam_b.token}"},
            )

        # when cam-a sends them all at once while cam-b sends a case
        with PeakRss(cloud.pid) as rss, ThreadPoolExecutor(BOMBS + 1) as pool:
            bombs = [pool.submit(bomb, i) for i in range(BOMBS)]
            other = pool.submit(cam_b_case)
            answers = [f.result() for f in bombs]
            answered = other.result()
        # then the cloud stayed under a gigabyte
        assert rss.peak < GB, f"peak RSS {rss.peak / 2**20:.0f} MiB"
        # and cam-b's case was answered by the primary model
        assert answered.status_code == 200, answered.text
        verdict = CloudVerdict.model_validate_json(answered.text)
        assert verdict.model == "ppocr6-cloud@6.0" and verdict.fallback_level == 0
        assert [d.text for d in verdict.result] == [TEXT]
        # and every bomb had a typed answer: a result, or 503 with Retry-After
        codes = sorted(r.status_code for r in answers)
        assert set(codes) <= {200, 503}, [r.text for r in answers if r.status_code >= 400]
        for refused in (r for r in answers if r.status_code == 503):
            assert refused.json()["error"]["code"] == "decode_budget_busy"
            assert int(refused.headers["retry-after"]) >= 1
        # and once the flood is over, every decoded pixel has gone back to the budget
        eventually(
            lambda: (
                'ef_decode_budget_bytes{state="reserved"} 0.0' in client.get("/metrics").text
            ),
            30,
            "the decode budget given back",
        )
        # and a bomb that can never fit is refused before decoding
        refused = client.post(
            "/v1/infer/ppocr6-cloud",
            content=jpeg_declaring(16384, 2441),
            headers={"Authorization": f"Bearer {cam_a.token}", "Content-Type": "image/jpeg"},
        )
        assert refused.status_code == 413 and "decoding takes" in refused.json()["error"]["message"]
    finally:
        cloud.terminate()
        cloud.wait(30)
