"""The case store's pieces, each built through its own constructor on one SQLite database
(migrated by `CaseStore`): the images, the look-ups, the ledger and the feedback log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.bench.harness import escalation_case
from edgefleet.cloud.feedback import FeedbackLog
from edgefleet.cloud.images import ImageStore
from edgefleet.cloud.ledger import CaseLedger, ClaimState
from edgefleet.cloud.lookup import CaseLookup
from edgefleet.cloud.store import CaseStore
from edgefleet.shared.db import Database
from edgefleet.shared.errors import Conflict, NotFound
from edgefleet.shared.messages import CloudVerdict, Detection, Feedback

PNG = b"\x89PNG\r\n\x1a\n" + b"pixels"


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database.connect(f"sqlite:///{tmp_path / 'cloud.db'}")
    CaseStore(database, tmp_path / "unused")  # the schema
    yield database
    database.close()


def ledger(db: Database, root: Path) -> CaseLedger:
    return CaseLedger(db, ImageStore(root), CaseLookup(db))


def claim(book: CaseLedger, case, replica: str = "r1"):
    return book.claim(
        case, image_sha256="a" * 64, image=PNG, source="mqtt", replica=replica, stale_after_s=60
    )


def verdict(case, text: str = "AB-12") -> CloudVerdict:
    return CloudVerdict(
        device_id=case.device_id,
        trace_id=case.trace_id,
        case_id=case.case_id,
        result=[Detection(text=text, score=0.99)],
        model="heavy",
        route="default",
        fallback_level=0,
        latency_ms=1.0,
    )


def test_an_image_is_stored_once_by_content_and_type(tmp_path: Path) -> None:
    images = ImageStore(tmp_path / "images")
    path = images.put("ab" + "0" * 62, "image/png", PNG)
    assert path == images.path("ab" + "0" * 62, "image/png")
    assert path.parent.name == "ab" and path.suffix == ".png" and path.read_bytes() == PNG
    # stored once: a second write of the same content leaves the first
    assert images.put("ab" + "0" * 62, "image/png", b"other") == path
    assert path.read_bytes() == PNG
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left


def test_the_ledger_claims_a_case_once_and_stores_its_verdict_once(db, tmp_path) -> None:
    book = ledger(db, tmp_path / "images")
    case = escalation_case("cam-a")
    assert claim(book, case).state is ClaimState.CLAIMED
    assert claim(book, case, "r2").state is ClaimState.IN_PROGRESS
    first = verdict(case)
    assert book.save_verdict(first, replica="r1") is True
    assert book.save_verdict(verdict(case, "late"), replica="r2") is False
    again = claim(book, case, "r2")
    assert again.state is ClaimState.DONE and again.verdict == first
    # its image is on disk, and the audit sees one case, answered, and both finished runs
    # (the late one is what "nothing done twice" looks for)
    assert list((tmp_path / "images").rglob("*.png"))
    [row] = book.accounts()
    assert row["answered"] and row["completed_runs"] == 2 and row["status"] == "done"


def test_the_lookup_finds_a_case_by_its_device_and_refuses_an_ambiguous_id(db, tmp_path) -> None:
    book = ledger(db, tmp_path / "images")
    lookup = CaseLookup(db)
    mine = escalation_case("cam-a", case_id="same-id-0001")
    claim(book, mine)
    assert lookup.owner("same-id-0001") == ("cam-a", "same-id-0001")
    with pytest.raises(NotFound):
        lookup.owner("same-id-0001", device_id="cam-b")  # another's id: not found, not told
    claim(book, escalation_case("cam-b", case_id="same-id-0001"))
    with pytest.raises(Conflict):
        lookup.owner("same-id-0001")
    assert lookup.case_device("same-id-0001", device_id="cam-b") == "cam-b"
    assert lookup.verdict("no-such-case-1") is None


def test_feedback_labels_its_case_in_the_export_and_needs_a_case(db, tmp_path) -> None:
    book = ledger(db, tmp_path / "images")
    log = FeedbackLog(db, CaseLookup(db))
    case = escalation_case("cam-a")
    claim(book, case)
    book.save_verdict(verdict(case), replica="r1")
    with pytest.raises(NotFound):
        log.add(
            Feedback(device_id="cam-a", case_id="no-such-case-1", label="X", correct=False),
            principal="operator:ops",
            signature="0" * 64,
        )
    assert [(r.label, r.label_source) for r in log.export()] == [("AB-12", "cloud")]
    log.add(
        Feedback(device_id="cam-a", case_id=case.case_id, label="AB-13", correct=False),
        principal="operator:ops",
        signature="0" * 64,
    )
    [record] = log.export()
    assert (record.label, record.label_source, record.label_by) == (
        "AB-13",
        "feedback",
        "operator:ops",
    )
    assert log.count_exportable() == 1
