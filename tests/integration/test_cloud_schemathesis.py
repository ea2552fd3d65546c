"""Schemathesis against the live /openapi.json: generated requests never get a 5xx."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from edgefleet.bench.harness import ServerThread
from edgefleet.cloud.app import create_app
from edgefleet.cloud.auth import key_digest
from edgefleet.cloud.settings import CloudSettings

OP_KEY = "op-fuzz-key-0123456789abcdef"
STREAMS = {"/v1/events"}  # server-sent events never end; a fuzzer would wait on each one


@pytest.fixture(scope="module")
def live_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("cloud-fuzz")
    cfg = CloudSettings(
        data_dir=tmp / "data",
        ingest={"enabled": False},
        api_keys=[{"name": "ops", "sha256": key_digest(OP_KEY)}],
        models={"preload": False, "served": ["ppocr"], "timeout_s": 30},
        http={"max_upload_bytes": 256_000},
    )
    app = create_app(cfg)
    app.state.services.fleet_registry.enroll("cam-fz")
    with ServerThread(app) as server:
        yield server.url


def test_no_server_errors(live_url: str) -> None:
    schema = schemathesis.openapi.from_url(f"{live_url}/openapi.json")
    auth = {"Authorization": f"Bearer {OP_KEY}"}
    operations = [
        op
        for op in (result.ok() for result in schema.get_all_operations())
        if op.path not in STREAMS
    ]
    assert len(operations) >= 8
    for operation in operations:
        # given any request the schema allows (and many it does not), as an operator
        @given(case=operation.as_strategy())
        @settings(
            max_examples=30,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case) -> None:
            response = case.call(headers=auth, timeout=60)
            # then the answer is never a 5xx
            case.validate_response(response, checks=[not_a_server_error])

        run()
