"""The rollout controller's pieces, each built through its own constructor on one SQLite
file: the book of deployments, the desired-state publisher and the canaries' bounds."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from edgefleet.fleet.bounds import CanaryBounds
from edgefleet.fleet.desired import DesiredPublisher
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.fleet.rollout_book import RolloutBook
from edgefleet.shared.db import Database
from edgefleet.shared.errors import Conflict, NotFound
from edgefleet.shared.messages import (
    DesiredState,
    DeviceTelemetry,
    EscalationCounters,
    Latency,
    StreamTelemetry,
    utcnow,
)
from edgefleet.shared.wire import Verifier, WireMessage

SPEC = {"image": "r.example/e@sha256:" + "e" * 64, "models": [], "config": {}}


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database.connect(f"sqlite:///{tmp_path}/fleet.db")
    yield database
    database.close()


def deployment(group: str = "lab", **bounds: float) -> dict:
    return {
        "grp": group,
        "spec": json.dumps(SPEC),
        "canary_count": 1,
        "auto_rollback": True,
        "soak_s": 0.0,
        "min_fps": bounds.get("min_fps"),
        "max_latency_p95_ms": bounds.get("max_latency_p95_ms"),
    }


def test_the_book_keeps_one_active_rollout_per_group_and_one_winner_per_transition(
    db: Database,
) -> None:
    book = RolloutBook(db)
    before = DesiredState(device_id="cam-01", deployment_id="dep-old", image="r/e:1")
    book.open("dep-1", deployment(), [("cam-01", "canary", before), ("cam-02", "rest", None)])
    with pytest.raises(Conflict, match="dep-1"):
        book.open("dep-2", deployment(), [("cam-03", "canary", None)])
    book.open("dep-3", deployment("other"), [("cam-09", "canary", None)])
    assert book.active("lab") is not None and book.active_id("lab") == "dep-1"
    # a transition is won once
    assert book.set_status("dep-1", "rolling", expect="canary")
    assert not book.set_status("dep-1", "rolling", expect="canary")
    book.set_target("dep-1", "cam-01", state="healthy", healthy_at=utcnow())
    view = book.get("dep-1")
    assert view.status == "rolling" and view.canaries == ["cam-01"]
    assert view.counts == {"healthy": 1, "pending": 1}
    assert book.previous("dep-1", "cam-01") == before and book.previous("dep-1", "cam-02") is None
    assert book.target("dep-1", "cam-02")["role"] == "rest"
    assert book.target("dep-1", "cam-77") is None
    with pytest.raises(NotFound):
        book.get("dep-nope")
    # once it ends, the group is free again
    assert book.set_status("dep-1", "completed", expect="rolling")
    assert book.active_ids() == ["dep-3"]


def test_the_desired_state_goes_out_signed_retained_and_kept(db: Database) -> None:
    registry = DeviceRegistry(db)
    registry.enroll("cam-01")
    registry.enroll("cam-02")
    registry.revoke("cam-02")
    sent: list[tuple[WireMessage, bool]] = []
    out = DesiredPublisher(registry, lambda wire, retain: sent.append((wire, retain)))
    desired = DesiredState(device_id="cam-01", deployment_id="dep-1", image="r/e:1")
    out.send("cam-01", desired, kind="rollout")
    out.send("cam-02", desired.model_copy(update={"device_id": "cam-02"}), kind="rollout")
    [(wire, retain)] = sent  # the revoked device is skipped
    assert retain and wire.topic == "ef/v1/cam-01/desired"
    assert Verifier(registry.device_key, max_skew_s=60).verify(wire).message == desired
    assert registry.desired("cam-01") == desired
    # nothing to go back to: the retained state is cleared
    out.send("cam-01", None, kind="rollback")
    assert sent[-1][0].payload == b"" and registry.desired("cam-01") is None


def test_canary_bounds_judge_only_telemetry_sent_after_the_canary_was_healthy(
    db: Database,
) -> None:
    registry = DeviceRegistry(db)
    registry.enroll("cam-01")
    bounds = CanaryBounds(registry)
    healthy_at = utcnow() - timedelta(seconds=30)
    target = {"device_id": "cam-01", "healthy_at": healthy_at}
    slow = deployment(min_fps=10.0)
    assert bounds.measured(deployment(), target) and bounds.problem(deployment(), target) is None
    assert not bounds.measured(slow, target)  # nothing sent since it was healthy
    registry.record_telemetry(
        DeviceTelemetry(
            device_id="cam-01",
            ts=healthy_at + timedelta(seconds=10),
            seq=1,
            uptime_s=1,
            escalations=EscalationCounters(sent=0, pending=0, dropped=0),
            outbox_depth=0,
            cpu_pct=10,
            ram_used_mb=10,
            streams=[
                StreamTelemetry(
                    stream_id="cam",
                    state="live",
                    fps=4.0,
                    frames_dropped=0,
                    latency_ms=Latency(p50=5, p95=9, p99=12),
                )
            ],
        )
    )
    assert bounds.measured(slow, target)
    assert bounds.problem(slow, target) == "fps 4.0 below the bound 10.0"
    assert bounds.problem(deployment(min_fps=2.0, max_latency_p95_ms=50.0), target) is None
