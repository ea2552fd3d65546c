"""Rollout state machine against a real SQLite store; the broker side is a recording list."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.fleet.rollout import RolloutController
from edgefleet.shared.db import Database
from edgefleet.shared.errors import Conflict, InvalidInput, NotFound
from edgefleet.shared.messages import (
    DesiredState,
    DeviceTelemetry,
    EscalationCounters,
    Latency,
    ReportedState,
    StreamTelemetry,
)
from edgefleet.shared.wire import Verifier, WireMessage

GOOD = "a" * 64
BAD_MODEL = "b" * 64


class Fleet:
    def __init__(self, tmp_path: Path, n: int = 5):
        self.db = Database.connect(f"sqlite:///{tmp_path}/fleet.db")
        self.registry = DeviceRegistry(self.db)
        self.devices = [f"cam-{i:02d}" for i in range(n)]
        for d in self.devices:
            self.registry.enroll(d, group="lab")
        self.sent: list[tuple[WireMessage, bool]] = []
        self.rollouts = RolloutController(
            self.registry,
            self.db,
            lambda wire, retain: self.sent.append((wire, retain)),
            tick_interval_s=None,  # the tests turn the clock themselves
        )
        self.verifier = Verifier(self.registry.device_key, max_skew_s=3600)

    def desired_for(self, device: str) -> list[DesiredState]:
        out = []
        for wire, retain in self.sent:
            if wire.topic == f"ef/v1/{device}/desired" and wire.payload:
                assert retain
                msg = self.verifier.verify(wire).message
                assert isinstance(msg, DesiredState)
                out.append(msg)
        return out

    def report(
        self,
        device: str,
        dep_id: str,
        status: str,
        error: str | None = None,
        running: str | None = None,
    ) -> None:
        """A device's report; it runs the deployment's image unless `running` says (""
        for no image)."""
        image = self.rollouts.get(dep_id).image
        self.rollouts.on_reported(
            ReportedState(
                device_id=device,
                deployment_id=dep_id,
                image=image,
                status=status,
                error=error,
                running_image=image if running is None else (running or None),
            )
        )

    def telemetry(self, device: str, fps: float, seq: int) -> None:
        stream = StreamTelemetry(
            stream_id="s0",
            state="live",
            fps=fps,
            frames_dropped=0,
            latency_ms=Latency(p50=5, p95=9, p99=12),
        )
        self.registry.record_telemetry(
            DeviceTelemetry(
                device_id=device,
                seq=seq,
                uptime_s=1,
                streams=[stream],
                escalations=EscalationCounters(sent=0, pending=0, dropped=0),
                outbox_depth=0,
                cpu_pct=1,
                ram_used_mb=1,
            )
        )


def request(**over):
    body = {
        "group": "lab",
        "image": "ghcr.io/acme/edge:1.2.0",
        "models": [{"name": "det", "version": "2", "url": "http://x/det", "sha256": GOOD}],
        "canary_percent": 10,
        "soak_s": 0,
    }
    body.update(over)
    return body


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return Fleet(tmp_path)


def test_canary_first_then_the_rest_after_healthy(fleet: Fleet) -> None:
    # when a rollout starts with 10% of 5 devices
    dep = fleet.rollouts.create(request())
    # then exactly one canary got the signed, retained desired state
    assert dep.status == "canary" and len(dep.canaries) == 1
    canary = dep.canaries[0]
    assert [d.deployment_id for d in fleet.desired_for(canary)] == [dep.id]
    assert all(not fleet.desired_for(d) for d in fleet.devices if d != canary)
    # when the canary reports applying then healthy (soak 0), the rest follow
    fleet.report(canary, dep.id, "applying")
    assert fleet.rollouts.get(dep.id).status == "canary"
    fleet.report(canary, dep.id, "healthy")
    assert fleet.rollouts.get(dep.id).status == "rolling"
    assert all(fleet.desired_for(d)[-1].deployment_id == dep.id for d in fleet.devices)
    for d in fleet.devices:
        fleet.report(d, dep.id, "healthy")
    assert fleet.rollouts.get(dep.id).status == "completed"
    assert fleet.registry.desired("cam-03").deployment_id == dep.id


@pytest.mark.parametrize(
    ("status", "running", "reason"),
    [
        ("healthy", "ghcr.io/acme/edge:1.1.0", "runs ghcr.io/acme/edge:1.1.0, not"),
        ("not_applied", None, "image not applied"),
    ],
)
def test_a_canary_not_running_the_new_image_is_not_healthy(
    fleet: Fleet, status: str, running: str | None, reason: str
) -> None:
    # given a rollout of a new image
    dep = fleet.rollouts.create(request())
    canary = dep.canaries[0]
    # when its canary says healthy while it runs another image, or cannot apply images
    error = "image not applied: ghcr.io/acme/edge:1.2.0" if status == "not_applied" else None
    fleet.report(canary, dep.id, status, error=error, running=running or "")
    # then the canary failed and the rollout is rolled back, nobody else got it
    view = fleet.rollouts.get(dep.id)
    assert view.status == "rolled_back" and reason in (view.error or "")
    assert all(not fleet.desired_for(d) for d in fleet.devices if d != canary)


def test_failed_canary_rolls_back_and_others_stay(fleet: Fleet) -> None:
    # given a completed first deployment everywhere
    first = fleet.rollouts.create(request())
    for d in fleet.devices:
        fleet.report(d, first.id, "healthy")
    assert fleet.rollouts.get(first.id).status == "completed"
    sent_before = {d: len(fleet.desired_for(d)) for d in fleet.devices}
    # when the next deployment's canary fails
    second = fleet.rollouts.create(
        request(models=[{"name": "det", "version": "3", "url": "http://x/d3", "sha256": BAD_MODEL}])
    )
    canary = second.canaries[0]
    fleet.report(canary, second.id, "failed", error="sha256 mismatch")
    # then the rollout is rolled back, the canary got the first deployment again
    view = fleet.rollouts.get(second.id)
    assert view.status == "rolled_back" and "sha256 mismatch" in view.error
    assert fleet.desired_for(canary)[-1].deployment_id == first.id
    assert fleet.registry.desired(canary).deployment_id == first.id
    # and nobody else was ever sent the second deployment
    for d in fleet.devices:
        if d != canary:
            assert len(fleet.desired_for(d)) == sent_before[d]
            assert fleet.registry.desired(d).deployment_id == first.id
    # and a late healthy report for the rolled-back deployment changes nothing
    fleet.report(canary, second.id, "healthy")
    assert fleet.rollouts.get(second.id).status == "rolled_back"


def test_without_auto_rollback_a_failure_halts(fleet: Fleet) -> None:
    dep = fleet.rollouts.create(request(auto_rollback=False))
    fleet.report(dep.canaries[0], dep.id, "failed", error="warm-up failed")
    assert fleet.rollouts.get(dep.id).status == "halted"
    assert fleet.desired_for(dep.canaries[0])[-1].deployment_id == dep.id


def test_soak_time_and_fps_bound(fleet: Fleet) -> None:
    # given a rollout with a 60 s soak and a 10 fps bound
    dep = fleet.rollouts.create(request(soak_s=60, min_fps=10))
    canary = dep.canaries[0]
    fleet.report(canary, dep.id, "healthy")
    fleet.telemetry(canary, fps=25, seq=1)
    # when the soak has not elapsed, nothing moves
    fleet.rollouts.tick()
    assert fleet.rollouts.get(dep.id).status == "canary"
    # when it has, and fps is within bounds, the rest follow
    fleet.rollouts.tick(now=datetime.now(timezone.utc) + timedelta(seconds=61))
    assert fleet.rollouts.get(dep.id).status == "rolling"


def test_canary_below_fps_bound_rolls_back(fleet: Fleet) -> None:
    dep = fleet.rollouts.create(request(soak_s=60, min_fps=10))
    canary = dep.canaries[0]
    fleet.report(canary, dep.id, "healthy")
    fleet.telemetry(canary, fps=2, seq=1)
    fleet.rollouts.tick()
    view = fleet.rollouts.get(dep.id)
    assert view.status == "rolled_back" and "fps" in view.error
    # no previous state existed: the retained desired is cleared
    assert fleet.sent[-1][0].payload == b""
    assert fleet.registry.desired(canary) is None


@pytest.mark.parametrize(
    ("over", "error", "needle"),
    [
        ({"group": "nope"}, NotFound, "nope"),
        ({"group": "Bad Group!"}, InvalidInput, "group"),
        (
            {"models": [{"name": "det", "version": "1", "url": "http://x", "sha256": "xyz"}]},
            InvalidInput,
            "sha256",
        ),
        ({"image": "Edge Image!!"}, InvalidInput, "image"),
        ({"image": "ghcr.io/acme/edge"}, InvalidInput, "image"),
        ({"canary_percent": 0}, InvalidInput, "canary_percent"),
        ({"models": [{"name": "det", "version": "1"}]}, InvalidInput, "url and sha256"),
        (
            {"models": [{"name": "det", "version": "../../x", "url": "http://x", "sha256": GOOD}]},
            InvalidInput,
            "version",
        ),
        (
            {"models": [{"name": "../det", "version": "1", "url": "http://x", "sha256": GOOD}]},
            InvalidInput,
            "name",
        ),
    ],
)
def test_bad_input_is_typed_and_changes_nothing(fleet: Fleet, over, error, needle) -> None:
    with pytest.raises(error) as caught:
        fleet.rollouts.create(request(**over))
    assert needle in str(caught.value)
    assert fleet.sent == []
    assert fleet.rollouts.list() == []


def test_concurrent_rollout_to_the_same_group_conflicts(fleet: Fleet) -> None:
    first = fleet.rollouts.create(request())
    sent = len(fleet.sent)
    with pytest.raises(Conflict) as caught:
        fleet.rollouts.create(request(image="ghcr.io/acme/edge:9"))
    assert first.id in str(caught.value)
    assert len(fleet.sent) == sent
    assert [d.id for d in fleet.rollouts.list()] == [first.id]


def test_the_timer_ends_the_soak_without_more_reports(tmp_path: Path) -> None:
    from tests.support.waiting import eventually

    fleet = Fleet(tmp_path)
    fleet.rollouts.tick_interval_s = 0.05
    try:
        dep = fleet.rollouts.create(request(soak_s=0.2))
        fleet.report(dep.canaries[0], dep.id, "healthy")
        # no further report arrives: the controller's own clock promotes the rollout
        eventually(lambda: fleet.rollouts.get(dep.id).status == "rolling", timeout_s=30)
    finally:
        fleet.rollouts.stop()


def test_canary_above_latency_bound_rolls_back(fleet: Fleet) -> None:
    # given a first deployment everywhere, then one bounded to a p95 of 5 ms
    first = fleet.rollouts.create(request())
    for d in fleet.devices:
        fleet.report(d, first.id, "healthy")
    dep = fleet.rollouts.create(request(image="ghcr.io/acme/edge:1.3.0", max_latency_p95_ms=5))
    canary = dep.canaries[0]
    # when the canary is healthy but its telemetry shows a p95 of 9 ms
    fleet.report(canary, dep.id, "healthy")
    fleet.telemetry(canary, fps=30, seq=1)
    fleet.rollouts.tick()
    # then the rollout stops and the canary gets the first deployment back
    view = fleet.rollouts.get(dep.id)
    assert view.status == "rolled_back" and "p95" in view.error
    assert fleet.desired_for(canary)[-1].deployment_id == first.id
    assert all(fleet.registry.desired(d).deployment_id == first.id for d in fleet.devices)


def test_progress_marker_moves_exactly_when_a_rollout_does(fleet: Fleet) -> None:
    # the dashboard stream rebuilds rollout views only when this marker changes
    empty = fleet.rollouts.book.progress_marker()
    assert fleet.rollouts.book.progress_marker() == empty
    dep = fleet.rollouts.create(request())
    created = fleet.rollouts.book.progress_marker()
    assert created != empty
    # a read or a tick that changes nothing leaves it alone
    fleet.rollouts.get(dep.id)
    fleet.rollouts.tick()
    assert fleet.rollouts.book.progress_marker() == created
    # a canary's report moves it, and so does the status change it causes
    fleet.report(dep.canaries[0], dep.id, "applying")
    applying = fleet.rollouts.book.progress_marker()
    assert applying != created
    fleet.report(dep.canaries[0], dep.id, "healthy")
    assert fleet.rollouts.get(dep.id).status == "rolling"
    assert fleet.rollouts.book.progress_marker() != applying


def test_canaries_that_never_report_stop_the_rollout_at_the_deadline(fleet: Fleet) -> None:
    from datetime import datetime, timedelta, timezone

    first = fleet.rollouts.create(request())
    for d in fleet.devices:
        fleet.report(d, first.id, "healthy")
    # given a rollout whose canary stays silent
    second = fleet.rollouts.create(request(image="ghcr.io/acme/edge:2", soak_s=30))
    canary = second.canaries[0]
    now = datetime.now(timezone.utc)
    fleet.rollouts.tick(now + timedelta(seconds=fleet.rollouts.report_deadline_s - 60))
    assert fleet.rollouts.get(second.id).status == "canary"
    # when the report deadline (plus the soak) has passed
    fleet.rollouts.tick(now + timedelta(seconds=fleet.rollouts.report_deadline_s + 60))
    # then it is rolled back, says why, and the group is free for the next rollout
    view = fleet.rollouts.get(second.id)
    assert view.status == "rolled_back" and canary in view.error and "report" in view.error
    assert fleet.desired_for(canary)[-1].deployment_id == first.id
    assert fleet.rollouts.create(request(image="ghcr.io/acme/edge:3")).status == "canary"


def test_an_operator_cancels_a_rollout_and_everyone_reached_goes_back(fleet: Fleet) -> None:
    first = fleet.rollouts.create(request())
    for d in fleet.devices:
        fleet.report(d, first.id, "healthy")
    second = fleet.rollouts.create(request(image="ghcr.io/acme/edge:2"))
    canary = second.canaries[0]
    fleet.report(canary, second.id, "healthy")  # rolling: everyone has been sent it
    assert fleet.rollouts.get(second.id).status == "rolling"
    # when an operator rolls it back
    view = fleet.rollouts.cancel(second.id)
    # then every device it reached has the first deployment again
    assert view.status == "rolled_back" and "cancelled" in view.error
    for d in fleet.devices:
        assert fleet.desired_for(d)[-1].deployment_id == first.id
    # and cancelling an ended rollout is a conflict
    with pytest.raises(Conflict):
        fleet.rollouts.cancel(second.id)
