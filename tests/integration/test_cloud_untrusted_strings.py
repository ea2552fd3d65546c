"""Untrusted strings cost the cloud linear time and bounded log lines (#32, finding 2).

The real `edgefleet cloud serve`: requests for a 60,000-character path, sent with no
credentials, are typed 404s, /healthz answers beside them, and what reaches the log is cut
to a bounded line before any pattern reads it (the old redaction rule took 5.9 s a request
and held the GIL, so five such requests stalled the cloud for 26 s)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from edgefleet.shared.logs import MAX_LOGGED_CHARS
from tests.integration.test_cloud_crash import _serve
from tests.integration.test_cloud_poison import _ready, _url


def test_a_huge_path_is_a_404_and_a_bounded_log_line(tmp_path: Path) -> None:
    config = tmp_path / "cloud.yaml"
    config.write_text(
        json.dumps(
            {
                "http": {"port": 0},
                "data_dir": str(tmp_path / "data"),
                "ingest": {"enabled": False},
                "models": {"preload": False},
                "log_level": "debug",
            }
        )
    )
    log = tmp_path / "serve.log"
    cloud = _serve(config, log)
    try:
        _ready(log, cloud, 1)
        url = _url(log)
        path = "/fleet/assets/" + "x" * 60_000
        with ThreadPoolExecutor(6) as pool:
            huge = [pool.submit(httpx.get, url + path, timeout=120) for _ in range(5)]
            health = pool.submit(httpx.get, url + "/healthz", timeout=120)
            answers = [f.result() for f in huge]
        assert health.result().status_code == 200
        for answer in answers:
            assert answer.status_code == 404
            assert answer.json()["error"]["code"]
        lines = log.read_text().splitlines()
        assert any("x" * 1000 in line for line in lines), "the request was never logged"
        assert max(len(line) for line in lines) < 3 * MAX_LOGGED_CHARS
    finally:
        cloud.terminate()
        cloud.wait(30)
