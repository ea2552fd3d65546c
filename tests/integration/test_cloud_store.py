"""The case store on the real PostgreSQL server (same interface as SQLite)."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from edgefleet.bench.harness import escalation_case
from edgefleet.cloud.ledger import ClaimState
from edgefleet.cloud.store import CaseStore
from edgefleet.shared.db import Database
from edgefleet.shared.messages import CloudVerdict, Detection, Feedback

PNG = b"\x89PNG\r\n\x1a\n" + b"fake pixels"


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path):
    url = (
        f"sqlite:///{tmp_path / 'cloud.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    db = Database.connect(url)
    yield CaseStore(db, tmp_path / "images")
    db.close()


def _verdict(case, text: str = "AB-12", level: int = 0) -> CloudVerdict:
    return CloudVerdict(
        device_id=case.device_id,
        trace_id=case.trace_id,
        case_id=case.case_id,
        result=[Detection(text=text, score=0.99)],
        model="ppocr-heavy@4.0",
        route="default",
        fallback_level=level,
        latency_ms=12.5,
    )


def test_claim_verdict_feedback_export(store: CaseStore) -> None:
    case = escalation_case("cam-pg", edge=[("AB-1Z", 0.42)])
    claim = dict(image_sha256="a" * 64, image=PNG, source="mqtt", stale_after_s=60)
    assert store.ledger.claim(case, replica="r1", **claim).state is ClaimState.CLAIMED
    # a second replica sees it in progress, then done once the verdict is stored
    assert store.ledger.claim(case, replica="r2", **claim).state is ClaimState.IN_PROGRESS
    assert store.ledger.save_verdict(_verdict(case), replica="r1") is True
    assert store.ledger.save_verdict(_verdict(case, "late"), replica="r2") is False
    again = store.ledger.claim(case, replica="r2", **claim)
    assert again.state is ClaimState.DONE and again.verdict.result[0].text == "AB-12"
    # feedback overrides the cloud label in the export
    store.feedback.add(
        Feedback(device_id="cam-pg", case_id=case.case_id, label="AB-13", correct=False),
        principal="operator:ops",
        signature="0" * 64,
    )
    record = store.lookup.case(case.case_id)
    assert record["received_at"].tzinfo is not None and record[
        "received_at"
    ].utcoffset() == timedelta(0)
    assert record["feedback"][0]["correct"] is False
    exported = list(store.feedback.export(page_size=2))
    assert [(r.case_id, r.label, r.label_source) for r in exported] == [
        (case.case_id, "AB-13", "feedback")
    ]
    assert Path(exported[0].image).read_bytes() == PNG
    assert store.lookup.edge_scores(
        datetime.now(timezone.utc) - timedelta(hours=1),
        datetime.now(timezone.utc) + timedelta(hours=1),
    ) == {("cam-pg", "ppocr"): [0.42]}


def test_accounts_count_deliveries_and_completed_runs(store: CaseStore) -> None:
    # given a case delivered twice (its claim and the claim of a copy, each noting the
    # delivery) and answered twice (two replicas raced), one delivered and refused before
    # a claim, and one stored and still pending
    twice, pending = escalation_case("cam-pg", frame_index=1), escalation_case("cam-pg")
    claim = dict(image_sha256="c" * 64, image=PNG, source="mqtt", stale_after_s=60)
    won = store.ledger.claim(twice, replica="r1", delivery=True, attempt=True, **claim)
    lost = store.ledger.claim(twice, replica="r2", delivery=True, attempt=True, **claim)
    assert (won.state, lost.state) == (ClaimState.CLAIMED, ClaimState.IN_PROGRESS)
    store.ledger.claim(pending, replica="r1", delivery=True, **claim)
    store.ledger.record_delivery("never-stored", source="mqtt", replica="r1")
    store.ledger.save_verdict(_verdict(twice), replica="r1")
    store.ledger.save_verdict(_verdict(twice, "late"), replica="r2")
    # when the accounts are read, then each says what the store saw of it
    accounts = {row["case_id"]: row for row in store.ledger.accounts()}
    assert accounts[twice.case_id]["deliveries"] == 2
    assert accounts[twice.case_id]["completed_runs"] == 2
    assert accounts[twice.case_id]["attempts"] == 1  # the claim that lost ran nothing
    assert accounts[twice.case_id]["answered"] is True
    assert accounts[pending.case_id]["answered"] is False
    assert accounts[pending.case_id]["completed_runs"] == 0
    assert accounts["never-stored"] == {
        "case_id": "never-stored",
        "device_id": None,
        "status": None,
        "attempts": 0,
        "completed_runs": 0,
        "answered": False,
        "deliveries": 1,
    }


def test_export_pages_through_many_cases_in_order(store: CaseStore) -> None:
    cases = [escalation_case("cam-pg", frame_index=i) for i in range(7)]
    for case in cases:
        store.ledger.claim(
            case, image_sha256="b" * 64, image=PNG, source="rest", replica="r", stale_after_s=60
        )
        store.ledger.save_verdict(_verdict(case), replica="r")
    busy = escalation_case("cam-pg", frame_index=99)
    store.ledger.claim(
        busy, image_sha256="b" * 64, image=PNG, source="rest", replica="r", stale_after_s=60
    )
    store.ledger.save_verdict(_verdict(busy, level=3), replica="r")  # busy verdicts are no label
    pending = escalation_case("cam-pg", frame_index=100)  # no verdict yet: not scanned
    store.ledger.claim(
        pending, image_sha256="b" * 64, image=PNG, source="rest", replica="r", stale_after_s=60
    )
    scanned: list[int] = []
    exported = list(store.feedback.export(page_size=3, on_scanned=lambda: scanned.append(1)))
    assert {r.case_id for r in exported} == {c.case_id for c in cases}
    assert all(r.label_source == "cloud" for r in exported)
    # the progress bar's total is exactly what the export scans
    assert store.feedback.count_exportable() == len(scanned) == 8


def test_concurrent_claims_have_one_winner(store: CaseStore) -> None:
    case = escalation_case("cam-pg")
    other = CaseStore(Database.connect(store.db.url), store.images.root)
    states: list[ClaimState] = []
    barrier = threading.Barrier(8)

    def claim(s: CaseStore, replica: str) -> None:
        barrier.wait()
        states.append(
            s.ledger.claim(
                case,
                image_sha256="c" * 64,
                image=PNG,
                source="mqtt",
                replica=replica,
                stale_after_s=60,
            ).state
        )

    threads = [
        threading.Thread(target=claim, args=(store if i % 2 else other, f"r{i}")) for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    other.db.close()
    assert states.count(ClaimState.CLAIMED) == 1
    assert states.count(ClaimState.IN_PROGRESS) == 7


def test_stale_claim_is_taken_over(store: CaseStore) -> None:
    case = escalation_case("cam-pg")
    kw = dict(image_sha256="d" * 64, image=PNG, source="mqtt")
    claim = store.ledger.claim
    assert claim(case, replica="dead", stale_after_s=60, **kw).state is ClaimState.CLAIMED
    store.db.execute(
        "UPDATE ef_cases SET claimed_at = ? WHERE case_id = ?",
        (datetime.now(timezone.utc) - timedelta(minutes=10), case.case_id),
    )
    assert claim(case, replica="alive", stale_after_s=60, **kw).state is ClaimState.CLAIMED


def test_the_orchestrator_runs_on_postgresql(pg_url: str, tmp_path: Path) -> None:
    from edgefleet.cloud.services import CloudServices
    from edgefleet.cloud.settings import CloudSettings

    rules = tmp_path / "rules.yaml"
    rules.write_text("default: {model: rules, timeout_s: 10}\n")
    settings = CloudSettings(
        data_dir=tmp_path / "data",
        database_url=pg_url,
        ingest={"enabled": False},
        models={"preload": False},
        rules={"file": rules},
    )
    services = CloudServices.build(settings)
    try:
        services.fleet_registry.enroll("cam-pg2")
        case = escalation_case("cam-pg2", edge=[("PG-1", 0.8)])
        verdict = services.processor.submit(case, PNG, source="rest").result(timeout=60)
        assert verdict.fallback_level == 2 and [d.text for d in verdict.result] == ["PG-1"]
        assert services.store.lookup.verdict(case.case_id) == verdict
        ready, body = services.readiness()
        assert ready and body["store"] == {"dialect": "postgresql", "writable": True}
    finally:
        services.close()


def test_drift_compares_this_week_with_the_reference_window(store: CaseStore) -> None:
    from prometheus_client import REGISTRY

    from edgefleet.cloud.drift import DriftWatch
    from edgefleet.cloud.settings import DriftSettings

    # given 30 confident cases three weeks ago and 30 unsure ones this week
    old = datetime.now(timezone.utc) - timedelta(days=21)
    for i in range(60):
        score = 0.9 if i < 30 else 0.3 + i / 1000
        case = escalation_case("cam-dr", frame_index=i, edge=[("X", score)])
        store.ledger.claim(
            case, image_sha256="e" * 64, image=PNG, source="mqtt", replica="r", stale_after_s=60
        )
        if i < 30:
            store.db.execute(
                "UPDATE ef_cases SET received_at = ? WHERE case_id = ?", (old, case.case_id)
            )
    watch = DriftWatch(store.lookup, DriftSettings(min_samples=20))
    # when drift is computed, then the KS statistic says the distributions are disjoint
    (reading,) = watch.compute()
    assert (reading.device_id, reading.model, reading.ks) == ("cam-dr", "ppocr", 1.0)
    assert (reading.current_n, reading.reference_n) == (30, 30)
    gauge = REGISTRY.get_sample_value(
        "ef_cloud_edge_score_drift_ks", {"device": "cam-dr", "model": "ppocr"}
    )
    assert gauge == 1.0
    assert watch.latest("cam-dr") == [reading] and watch.latest("other") == []
