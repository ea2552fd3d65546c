"""What one device (or a crash) must not be able to do to the orchestrator: starve the
other devices, leave a case unanswered, share a replica's identity, guess its share group."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from edgefleet.bench.harness import escalation_case
from edgefleet.cloud.processor import CaseProcessor
from edgefleet.cloud.replica import ReplicaIdentity
from edgefleet.cloud.settings import CloudSettings
from edgefleet.shared.errors import Overloaded
from edgefleet.shared.messages import CloudVerdict
from tests.support.cloud import PNG, rules_only_services


class Gate:
    """A publish hook that holds the only worker on the first verdict until `open`."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.held = threading.Event()
        self._open = threading.Event()

    def __call__(self, verdict: CloudVerdict) -> None:
        self.order.append(verdict.device_id)
        self.held.set()
        assert self._open.wait(30)

    def open(self) -> None:
        self._open.set()


def test_one_devices_flood_does_not_push_another_device_back(tmp_path: Path) -> None:
    svc = rules_only_services(tmp_path)
    gate = Gate()
    svc.processor.answers.publish = gate
    try:
        # given the only worker busy with a first case of cam-a
        svc.processor.submit(escalation_case("cam-a"), PNG, source="mqtt", flow_controlled=True)
        assert gate.held.wait(30)
        # when cam-a floods 20 more cases, then cam-b sends one
        futures = [
            svc.processor.submit(
                escalation_case("cam-a", frame_index=i), PNG, source="mqtt", flow_controlled=True
            )
            for i in range(1, 21)
        ]
        futures.append(
            svc.processor.submit(escalation_case("cam-b"), PNG, source="mqtt", flow_controlled=True)
        )
        gate.open()
        for future in futures:
            future.result(timeout=60)
        # then cam-b took its turn after one more of cam-a's, not after all twenty
        assert gate.order.index("cam-b") <= 2, gate.order
    finally:
        gate.open()
        svc.close()


def test_a_devices_rest_quota_refuses_it_and_not_the_others(tmp_path: Path) -> None:
    svc = rules_only_services(tmp_path, max_pending_per_device=3)
    gate = Gate()
    svc.processor.answers.publish = gate
    try:
        svc.processor.submit(escalation_case("cam-a"), PNG, source="rest")
        assert gate.held.wait(30)
        for i in range(3):
            svc.processor.submit(escalation_case("cam-a", frame_index=i + 1), PNG, source="rest")
        # when cam-a goes over its quota it gets a 429, while cam-b is still taken
        with pytest.raises(Overloaded, match="quota"):
            svc.processor.submit(escalation_case("cam-a", frame_index=9), PNG, source="rest")
        other = svc.processor.submit(escalation_case("cam-b"), PNG, source="rest")
        gate.open()
        assert other.result(timeout=60) is not None
    finally:
        gate.open()
        svc.close()


def test_a_case_left_in_progress_by_a_crash_is_swept_and_answered(tmp_path: Path) -> None:
    # given a case claimed by this replica in its previous life, never answered
    first = rules_only_services(tmp_path)
    case = escalation_case("cam-a")
    first.store.ledger.claim(
        case,
        image_sha256="0" * 64,
        image=PNG,
        source="mqtt",
        replica=first.replica,
        stale_after_s=60,
    )
    replica = first.replica
    first.close()  # releases the identity, as a crash would
    # when the replica starts again (same data folder: same identity)
    second = rules_only_services(tmp_path)
    try:
        assert second.replica == replica
        # then its sweep runs the case again and stores a verdict
        verdict = second.processor.wait_verdict(case.case_id, timeout_s=30)
        assert verdict is not None and verdict.case_id == case.case_id
    finally:
        second.close()


def test_a_redelivered_case_another_worker_holds_is_not_acked_until_answered(
    tmp_path: Path,
) -> None:
    svc = rules_only_services(tmp_path)
    svc.processor.runner.recheck_s = 0.05
    try:
        # given a case another live replica has just claimed
        case = escalation_case("cam-a")
        svc.store.ledger.claim(
            case, image_sha256="1" * 64, image=PNG, source="mqtt", replica="other", stale_after_s=60
        )
        # when the broker redelivers it here
        future = svc.processor.submit(case, PNG, source="mqtt", flow_controlled=True)
        held = threading.Event()
        future.add_done_callback(lambda f: held.set())
        # then it is held (not answered None) while the owner works on it ...
        assert not held.wait(0.5)
        # ... and resolved with the owner's verdict once that is stored
        verdict = CloudVerdict(
            device_id="cam-a",
            trace_id=case.trace_id,
            case_id=case.case_id,
            result=[],
            model="rules",
            route="default",
            fallback_level=2,
            latency_ms=1.0,
        )
        svc.store.ledger.save_verdict(verdict, replica="other")
        assert future.result(timeout=30) == verdict
    finally:
        svc.close()


def test_replica_identity_survives_a_restart_and_is_never_shared(tmp_path: Path) -> None:
    one = ReplicaIdentity.claim(tmp_path)
    two = ReplicaIdentity.claim(tmp_path)  # a sibling on the same data folder
    assert one.name != two.name
    name = one.name
    one.release()  # the process ends (kill -9 releases the lock the same way)
    again = ReplicaIdentity.claim(tmp_path)
    assert again.name == name
    assert sorted(p.stem for p in (tmp_path / "replicas").iterdir()) == sorted([name, two.name])
    again.release()
    two.release()


def test_share_group_is_derived_from_the_clouds_secret() -> None:
    def group(password: str | None, configured: str | None = None) -> str:
        return CloudSettings(
            mqtt={"username": "cloud", "password": password},
            ingest={"share_group": configured},
        ).resolved_share_group()

    assert group("efp_one") == group("efp_one")
    assert group("efp_one") != group("efp_two")
    assert "edgefleet" not in group("efp_one") and group(None, "mine") == "mine"


def test_readyz_gives_no_client_id_away(tmp_path: Path) -> None:
    svc = rules_only_services(tmp_path)
    try:
        _, body = svc.readiness()
        assert svc.replica not in str(body)
    finally:
        svc.close()


def test_without_a_master_key_the_cloud_says_loudly_what_that_means(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import stat

    svc = rules_only_services(tmp_path)
    try:
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert any("device_master_key" in m and "sign as any device" in m for m in warned)
        # and its data folder and store are private, whatever the umask
        assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700
        assert stat.S_IMODE((tmp_path / "data" / "cloud.db").stat().st_mode) == 0o600
    finally:
        svc.close()


def test_a_case_processor_runs_nothing_until_started(tmp_path: Path) -> None:
    # a processor's stale sweep runs as soon as its thread starts: before its verdicts have
    # their way out, a case it swept would be answered and never sent
    services = rules_only_services(tmp_path)
    try:

        def sweeps() -> int:
            return sum(t.name == "case-sweep" for t in threading.enumerate())

        before = sweeps()
        processor = CaseProcessor(
            services.store, services.router, services.cascade, services.decode, replica="x"
        )
        assert sweeps() == before
        processor.start()
        processor.start()  # idempotent
        assert sweeps() == before + 1
        processor.close()
    finally:
        services.close()
