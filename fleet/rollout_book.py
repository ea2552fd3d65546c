"""The rollouts' book: each deployment and its targets (device, role, state, the desired
state it replaced), the views of them, and conditional updates so that only one caller
(thread or replica) wins each transition. At most one rollout is active per group, even
across orchestrator replicas (a unique index)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from edgefleet.fleet.deployment import DeploymentView, Status, TargetState, TargetView
from edgefleet.shared.db import Database
from edgefleet.shared.errors import Conflict, NotFound
from edgefleet.shared.messages import DesiredState, ModelRef, utcnow

# Database rows; inside RolloutBook, `list` names its own list() method.
Rows = list[dict[str, Any]]
ACTIVE = ("canary", "rolling")

_SCHEMA_V1 = [
    """CREATE TABLE IF NOT EXISTS fleet_deployments (
        id TEXT PRIMARY KEY,
        grp TEXT NOT NULL,
        spec TEXT NOT NULL,
        canary_count {bigint} NOT NULL,
        auto_rollback {bool} NOT NULL,
        soak_s {double} NOT NULL,
        min_fps {double},
        max_latency_p95_ms {double},
        status TEXT NOT NULL,
        error TEXT,
        created_at {ts} NOT NULL,
        updated_at {ts} NOT NULL
    )""",
    # at most one active rollout per group, even across orchestrator replicas
    "CREATE UNIQUE INDEX IF NOT EXISTS fleet_deployments_one_active ON fleet_deployments (grp) "
    "WHERE status IN ('canary', 'rolling')",
    """CREATE TABLE IF NOT EXISTS fleet_deployment_targets (
        deployment_id TEXT NOT NULL,
        device_id TEXT NOT NULL,
        role TEXT NOT NULL,
        state TEXT NOT NULL,
        previous TEXT,
        healthy_at {ts},
        error TEXT,
        updated_at {ts} NOT NULL,
        PRIMARY KEY (deployment_id, device_id)
    )""",
    "CREATE INDEX IF NOT EXISTS fleet_targets_device ON fleet_deployment_targets (device_id)",
]


class RolloutBook:
    def __init__(self, db: Database):
        t = db.types
        db.migrate(
            "fleet_rollout_v1",
            [
                s.format(ts=t.timestamp, bool=t.boolean, double=t.double, bigint=t.bigint)
                for s in _SCHEMA_V1
            ],
        )
        self.db = db

    def open(
        self,
        dep_id: str,
        deployment: dict[str, Any],
        targets: list[tuple[str, str, DesiredState | None]],
    ) -> None:
        """Record a new deployment (its columns) and its targets (device, role, the desired
        state it replaces) in one transaction; Conflict if the group has an active one."""
        now = utcnow()
        group = deployment["grp"]
        with self.db.transaction():
            if self.active_id(group) is not None:
                raise self._active_conflict(group)
            row = {**deployment, "id": dep_id, "status": "canary"}
            columns = ", ".join([*row, "created_at", "updated_at"])
            marks = ", ".join("?" for _ in range(len(row) + 2))
            try:
                self.db.execute(
                    f"INSERT INTO fleet_deployments ({columns}) VALUES ({marks})",
                    (*row.values(), now, now),
                )
            except Conflict:
                raise self._active_conflict(group) from None
            for device, role, previous in targets:
                self.db.execute(
                    "INSERT INTO fleet_deployment_targets (deployment_id, device_id, role, state, "
                    "previous, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        dep_id,
                        device,
                        role,
                        "pending",
                        previous.model_dump_json() if previous else None,
                        now,
                    ),
                )

    def active_id(self, group: str | None = None) -> str | None:
        """The active deployment of the group (of any group without one)."""
        where = "status IN ('canary', 'rolling')" + (" AND grp = ?" if group is not None else "")
        row = self.db.query_one(
            f"SELECT id FROM fleet_deployments WHERE {where}",
            (group,) if group is not None else (),
        )
        return row["id"] if row else None

    def active_ids(self) -> list[str]:
        rows = self.db.query(
            "SELECT id FROM fleet_deployments WHERE status IN ('canary', 'rolling')"
        )
        return [row["id"] for row in rows]

    def row(self, dep_id: str) -> dict[str, Any]:
        row = self.db.query_one("SELECT * FROM fleet_deployments WHERE id = ?", (dep_id,))
        if row is None:
            raise NotFound(f"deployment {dep_id!r} not found")
        return row

    def targets(self, dep_id: str) -> Rows:
        return self.db.query(
            "SELECT * FROM fleet_deployment_targets WHERE deployment_id = ? "
            "ORDER BY role, device_id",
            (dep_id,),
        )

    def auto_rollback(self, dep_id: str) -> bool:
        return bool(self.row(dep_id)["auto_rollback"])

    def set_status(
        self, dep_id: str, status: Status, *, expect: Status, error: str | None = None
    ) -> bool:
        """Conditional update: only one caller (thread or replica) wins each transition."""
        return (
            self.db.execute(
                "UPDATE fleet_deployments SET status = ?, error = COALESCE(?, error), "
                "updated_at = ? WHERE id = ? AND status = ?",
                (status, error, utcnow(), dep_id, expect),
            )
            == 1
        )

    def set_target(
        self,
        dep_id: str,
        device: str,
        *,
        state: TargetState,
        healthy_at: datetime | None = None,
        error: str | None = None,
    ) -> None:
        self.db.execute(
            "UPDATE fleet_deployment_targets SET state = ?, healthy_at = COALESCE(?, healthy_at), "
            "error = COALESCE(?, error), updated_at = ? WHERE deployment_id = ? AND device_id = ?",
            (state, healthy_at, error, utcnow(), dep_id, device),
        )

    def target(self, dep_id: str, device: str) -> dict[str, Any] | None:
        """The device's role and state in the deployment, with the deployment's status and
        spec; None if it is not one of its targets."""
        return self.db.query_one(
            "SELECT t.role, t.state, d.status, d.spec FROM fleet_deployment_targets t "
            "JOIN fleet_deployments d ON d.id = t.deployment_id "
            "WHERE t.deployment_id = ? AND t.device_id = ?",
            (dep_id, device),
        )

    def previous(self, dep_id: str, device: str) -> DesiredState | None:
        """The desired state the deployment replaced on the device."""
        row = self.db.query_one(
            "SELECT previous FROM fleet_deployment_targets WHERE deployment_id = ? "
            "AND device_id = ?",
            (dep_id, device),
        )
        assert row is not None  # called for the deployment's own targets
        return DesiredState.model_validate_json(row["previous"]) if row["previous"] else None

    # --- views ------------------------------------------------------------------------

    def get(self, dep_id: str) -> DeploymentView:
        dep = self.row(dep_id)
        spec = json.loads(dep["spec"])
        targets = [
            TargetView(
                device_id=t["device_id"],
                role=t["role"],
                state=t["state"],
                healthy_at=t["healthy_at"],
                error=t["error"],
            )
            for t in self.targets(dep_id)
        ]
        counts: dict[str, int] = {}
        for t in targets:
            counts[t.state] = counts.get(t.state, 0) + 1
        return DeploymentView(
            id=dep["id"],
            group=dep["grp"],
            image=spec["image"],
            image_requested=spec.get("image_requested", spec["image"]),
            models=[ModelRef.model_validate(m) for m in spec["models"]],
            config=spec["config"],
            status=dep["status"],
            error=dep["error"],
            auto_rollback=bool(dep["auto_rollback"]),
            soak_s=dep["soak_s"],
            created_at=dep["created_at"],
            updated_at=dep["updated_at"],
            canaries=[t.device_id for t in targets if t.role == "canary"],
            targets=targets,
            counts=counts,
        )

    def list(self, limit: int = 20) -> list[DeploymentView]:
        rows = self.db.query(
            "SELECT id FROM fleet_deployments ORDER BY created_at DESC LIMIT ?", (limit,)
        )
        return [self.get(r["id"]) for r in rows]

    def progress_marker(self, limit: int = 20) -> tuple[Any, ...]:
        """A cheap fingerprint of the newest `limit` deployments: it changes whenever one of
        them or one of their targets changes, so a live view rebuilds `list` only then."""
        newest = "SELECT id FROM fleet_deployments ORDER BY created_at DESC LIMIT ?"
        deps = self.db.query_one(
            "SELECT COUNT(*) AS n, MAX(updated_at) AS at FROM fleet_deployments"
        )
        targets = self.db.query_one(
            "SELECT COUNT(*) AS n, MAX(updated_at) AS at FROM fleet_deployment_targets "
            f"WHERE deployment_id IN ({newest})",
            (limit,),
        )
        assert deps is not None and targets is not None  # aggregates always return a row
        return (deps["n"], deps["at"], targets["n"], targets["at"])

    def active(self, group: str) -> DeploymentView | None:
        dep_id = self.active_id(group)
        return self.get(dep_id) if dep_id else None

    def deployed_to(self, device_id: str, name: str, version: str) -> bool:
        """Whether NAME@VERSION is in a deployment to the device or to its group: the only
        models a device may download."""
        rows = self.db.query(
            "SELECT spec FROM fleet_deployments WHERE grp IN "
            "(SELECT grp FROM fleet_devices WHERE device_id = ?) OR id IN "
            "(SELECT deployment_id FROM fleet_deployment_targets WHERE device_id = ?)",
            (device_id, device_id),
        )
        return any(
            model["name"] == name and model["version"] == version
            for row in rows
            for model in json.loads(row["spec"])["models"]
        )

    def _active_conflict(self, group: str) -> Conflict:
        active = self.active_id(group) or "another rollout"
        return Conflict(
            f"group {group!r} already has an active rollout ({active})",
            hint="wait for it to finish, or roll it back, before starting another",
        )
