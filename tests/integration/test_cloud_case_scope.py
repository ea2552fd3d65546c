"""Case ids are scoped per device (#32, finding 8).

Through the served app (uvicorn, the shipped routes, SQLite and PostgreSQL): a device that
reuses another device's case id gets its own case and its own verdict, never the other's;
asking for an id that is not its own is the same 404 as an unknown id (no 409 or 403 that
would say it exists); an operator names the device when an id is ambiguous. And the
store's migration keeps the rows of a store written before case ids were per device."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from edgefleet.bench.harness import ServerThread, escalation_case
from edgefleet.cloud import store as store_schema
from edgefleet.cloud.app import create_app
from edgefleet.cloud.auth import key_digest, sign_body
from edgefleet.cloud.ledger import ClaimState
from edgefleet.cloud.settings import CloudSettings
from edgefleet.cloud.store import CaseStore
from edgefleet.shared.db import Database
from edgefleet.shared.messages import CloudVerdict, Detection
from tests.support.cloud import PNG

OP_KEY = "op-scope-key-" + "x" * 20
SHARED_ID = "shared-case-0001"


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'cloud.db'}"
    return request.getfixturevalue("pg_url")


class Cloud:
    def __init__(self, url: str, tokens: dict[str, str], keys: dict[str, bytes]):
        self.url, self.tokens, self.keys = url, tokens, keys
        self.http = httpx.Client(base_url=url, timeout=60)

    def escalate(self, device: str, case_id: str = SHARED_ID) -> httpx.Response:
        case = escalation_case(device, edge=[(f"{device}-TEXT", 0.9)], case_id=case_id)
        return self.http.post(
            "/v1/escalations",
            params={"wait": 30},
            files={"image": ("crop.png", PNG, "image/png")},
            data={"metadata": json.dumps(case.model_dump(mode="json", by_alias=True))},
            headers=self.auth(device),
        )

    def auth(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {OP_KEY if who == 'ops' else self.tokens[who]}"}

    def feedback(self, device: str, case_id: str) -> httpx.Response:
        body = json.dumps({"case_id": case_id, "label": "X", "correct": False}).encode()
        headers = {
            **self.auth(device),
            "Content-Type": "application/json",
            "X-EF-Signature": sign_body(self.keys[device], body),
        }
        return self.http.post("/v1/feedback", content=body, headers=headers)


@pytest.fixture
def cloud(database_url: str, tmp_path: Path) -> Iterator[Cloud]:
    rules = tmp_path / "rules.yaml"
    rules.write_text("default: {model: rules, timeout_s: 5}\n")
    settings = CloudSettings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        ingest={"enabled": False},
        models={"preload": False},
        rules={"file": rules},
        api_keys=[{"name": "ops", "sha256": key_digest(OP_KEY)}],
    )
    app = create_app(settings)
    registry = app.state.services.fleet_registry
    enrolled = {d: registry.enroll(d) for d in ("cam-a", "cam-b", "cam-c")}
    server = ServerThread(app).start()
    try:
        yield Cloud(
            server.url,
            {d: e.token for d, e in enrolled.items()},
            {d: e.device_key for d, e in enrolled.items()},
        )
    finally:
        server.stop()


def test_a_reused_case_id_is_the_devices_own_and_reveals_nothing(cloud: Cloud) -> None:
    # given cam-a's case, answered
    first = cloud.escalate("cam-a")
    assert first.status_code == 200, first.text
    # when cam-b sends a case under the same id
    second = cloud.escalate("cam-b")
    # then it is cam-b's own case, answered with its own verdict (not a 409, not cam-a's)
    assert second.status_code == 200, second.text
    verdict = CloudVerdict.model_validate_json(second.text)
    assert verdict.device_id == "cam-b" and [d.text for d in verdict.result] == ["cam-b-TEXT"]
    # and each device reads its own case under that id
    for device in ("cam-a", "cam-b"):
        record = cloud.http.get(f"/v1/escalations/{SHARED_ID}", headers=cloud.auth(device))
        assert record.status_code == 200 and record.json()["device_id"] == device
        assert record.json()["edge_result"][0]["text"] == f"{device}-TEXT"
    # and a device with no case of that id hears what it hears for an unknown id: 404
    unknown = "never-sent-0001"
    for path in ("/v1/escalations/{}", "/v1/escalations/{}/image"):
        taken = cloud.http.get(path.format(SHARED_ID), headers=cloud.auth("cam-c"))
        absent = cloud.http.get(path.format(unknown), headers=cloud.auth("cam-c"))
        assert taken.status_code == absent.status_code == 404
        assert taken.json()["error"]["code"] == absent.json()["error"]["code"]
    taken, absent = cloud.feedback("cam-c", SHARED_ID), cloud.feedback("cam-c", unknown)
    assert taken.status_code == absent.status_code == 404
    assert taken.json()["error"]["code"] == absent.json()["error"]["code"]
    # and feedback from cam-b lands on cam-b's case, not cam-a's
    assert cloud.feedback("cam-b", SHARED_ID).status_code == 201
    mine = cloud.http.get(f"/v1/escalations/{SHARED_ID}", headers=cloud.auth("cam-b")).json()
    theirs = cloud.http.get(f"/v1/escalations/{SHARED_ID}", headers=cloud.auth("cam-a")).json()
    assert len(mine["feedback"]) == 1 and theirs["feedback"] == []
    # and a device's own duplicate is still a 409
    assert cloud.escalate("cam-b").status_code == 409
    # and an operator names the device where an id is ambiguous
    ambiguous = cloud.http.get(f"/v1/escalations/{SHARED_ID}", headers=cloud.auth("ops"))
    assert ambiguous.status_code == 409
    assert ambiguous.json()["error"]["code"] == "ambiguous_case_id"
    named = cloud.http.get(
        f"/v1/escalations/{SHARED_ID}", params={"device": "cam-a"}, headers=cloud.auth("ops")
    )
    assert named.status_code == 200 and named.json()["device_id"] == "cam-a"
    image = cloud.http.get(
        f"/v1/escalations/{SHARED_ID}/image", params={"device": "cam-b"}, headers=cloud.auth("ops")
    )
    assert image.status_code == 200 and image.content == PNG
    # and an id only one device sent needs no qualifier (the contract as before)
    cloud.escalate("cam-c", case_id="only-cam-c-0001")
    alone = cloud.http.get("/v1/escalations/only-cam-c-0001", headers=cloud.auth("ops"))
    assert alone.status_code == 200 and alone.json()["device_id"] == "cam-c"


def test_the_migration_keeps_a_store_written_before_ids_were_per_device(
    database_url: str, tmp_path: Path
) -> None:
    # given a store at its previous schema, holding cam-a's case, verdict and feedback
    db = Database.connect(database_url)
    db.migrate("cloud_001_feedback_store", store_schema._schema(db))
    db.migrate("cloud_002_deliveries", store_schema._deliveries_schema(db))
    case = escalation_case("cam-a", edge=[("OLD-1", 0.4)], case_id=SHARED_ID)
    verdict = CloudVerdict(
        device_id="cam-a",
        trace_id=case.trace_id,
        case_id=SHARED_ID,
        result=[Detection(text="OLD-1", score=0.99)],
        model="m@1",
        route="default",
        fallback_level=0,
        latency_ms=1.0,
    )
    now = case.ts
    db.execute(
        """INSERT INTO ef_cases (case_id, device_id, stream_id, frame_index, reason, trace_id,
            edge_model, edge_model_version, edge_score, meta, image_sha256, image_path,
            content_type, image_bytes, source, received_at, status, attempts, completed_runs)
           VALUES (?, 'cam-a', 'cam', 0, 'unsure', ?, 'ppocr', '4', 0.4, ?, ?, ?, 'image/png',
            10, 'mqtt', ?, 'done', 1, 1)""",
        (SHARED_ID, case.trace_id, case.model_dump_json(), "a" * 64, str(tmp_path / "a.png"), now),
    )
    db.execute(
        """INSERT INTO ef_verdicts (case_id, verdict, model, route, fallback_level, latency_ms,
            cached, processed_by, created_at)
           VALUES (?, ?, 'm@1', 'default', 0, 1.0, ?, 'r1', ?)""",
        (SHARED_ID, verdict.model_dump_json(), False, now),
    )
    db.execute(
        """INSERT INTO ef_feedback (case_id, label, correct, author, principal, signature,
            received_at) VALUES (?, 'OLD-1', ?, NULL, 'operator:ops', 'sig', ?)""",
        (SHARED_ID, True, now),
    )
    db.execute(
        "INSERT INTO ef_deliveries (case_id, source, replica, received_at) "
        "VALUES (?, 'mqtt', 'r1', ?)",
        (SHARED_ID, now),
    )
    # when the store opens it (the migration runs)
    store = CaseStore(db, tmp_path / "images")
    try:
        # then cam-a's rows are all there, under cam-a
        assert store.lookup.verdict(SHARED_ID, device_id="cam-a") == verdict
        record = store.lookup.case(SHARED_ID, device_id="cam-a")
        assert [f["label"] for f in record["feedback"]] == ["OLD-1"]
        accounts = store.ledger.accounts()
        assert [(r["device_id"], r["deliveries"], r["answered"]) for r in accounts] == [
            ("cam-a", 1, True)
        ]
        assert [r.label for r in store.feedback.export()] == ["OLD-1"]
        # and cam-b can now claim the same id as its own case, never handed cam-a's verdict
        claim = store.ledger.claim(
            escalation_case("cam-b", case_id=SHARED_ID),
            image_sha256="b" * 64,
            image=PNG,
            source="rest",
            replica="r1",
            stale_after_s=60,
        )
        assert claim.state is ClaimState.CLAIMED and claim.verdict is None
        assert store.lookup.verdict(SHARED_ID, device_id="cam-b") is None
    finally:
        db.close()
