"""Two cloud replicas recording one device's telemetry on PostgreSQL take turns on its row:
the second reads what the first committed, so the escalation rate it stores is measured
from the newest message, not from the one both saw before."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest

from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.shared.db import Database
from tests.support.waiting import eventually
from tests.unit.test_fleet_registry import telemetry


def test_a_replica_waits_for_the_others_telemetry_of_the_same_device(pg_url: str) -> None:
    first_db, second_db, watch_db = (Database.connect(pg_url) for _ in range(3))
    try:
        first = DeviceRegistry(first_db, history_bucket_s=10)
        second = DeviceRegistry(second_db, history_bucket_s=10)
        first.enroll("cam-01")
        t0 = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=5)
        first.record_telemetry(telemetry("cam-01", 1, sent=0, ts=t0))
        errors: list[BaseException] = []

        def second_replica() -> None:
            try:
                with second_db.transaction():
                    second.record_telemetries(
                        [telemetry("cam-01", 3, sent=18, ts=t0 + timedelta(seconds=60))]
                    )
            except BaseException as exc:  # reported by the test thread
                errors.append(exc)

        # given one replica inside its batch, the device's message of t0+30 s recorded
        with first_db.transaction():
            first.record_telemetries(
                [telemetry("cam-01", 2, sent=6, ts=t0 + timedelta(seconds=30))]
            )
            # when the other replica takes the device's next message (t0+60 s) meanwhile
            other = threading.Thread(target=second_replica)
            other.start()
            # then it waits on the device's row until the first commits
            eventually(
                lambda: (
                    watch_db.query_one(
                        "SELECT count(*) AS n FROM pg_stat_activity "
                        "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                    )["n"]
                    >= 1
                ),
                10.0,
                "the second replica waiting on the device's row",
            )
        other.join(30.0)
        assert not other.is_alive() and not errors, errors
        # and its rate is from the message the first committed: 12 sent in 30 s
        points = DeviceRegistry(watch_db, history_bucket_s=10).telemetry.history("cam-01", hours=1)
        assert [p.outbox_depth for p in points] == [1, 2, 3]
        assert points[-1].escalation_rate == pytest.approx(24.0)
    finally:
        for db in (first_db, second_db, watch_db):
            db.close()
