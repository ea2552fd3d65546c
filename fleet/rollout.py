"""Rollouts: a desired state to a group, canaries first, the rest after a healthy soak.

A deployment (image tag + model refs + pipeline config, aimed at a group) goes to its
canaries as a signed, retained `DesiredState` on `ef/v1/{device}/desired`. The devices
answer on `reported`; `on_reported` and `tick` move the deployment along:

    canary ──all canaries healthy for soak_s, within bounds──▶ rolling ──all healthy──▶ completed
      │                                                          └─ some failed ─▶ failed
      └─ a canary failed / out of bounds ─▶ rolled_back (auto-rollback: canaries get their
                                            previous state back) or halted (no auto-rollback)

Retained messages are what make offline devices safe: a device that was away gets the
last desired state the moment it subscribes again. State lives in the database, so a
restarted orchestrator (or another replica) carries on where this one stopped.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from prometheus_client import Counter

from edgefleet.fleet.deployment import (
    IMAGE_RE,
    DeploymentModel,
    DeploymentRequest,
    DeploymentView,
    Status,
    TargetState,
    TargetView,
    parse_request,
)
from edgefleet.fleet.devices import validate_group
from edgefleet.fleet.models import ModelStore
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.shared.db import Database
from edgefleet.shared.errors import Conflict, InvalidInput, NotFound
from edgefleet.shared.messages import DesiredState, ModelRef, ReportedState, utcnow
from edgefleet.shared.topics import Topics
from edgefleet.shared.wire import WireMessage, encode

# The request/view models live in edgefleet.fleet.deployment; they stay importable from here.
__all__ = [
    "ACTIVE",
    "DESIRED_SENT",
    "IMAGE_RE",
    "ROLLOUTS",
    "DeploymentModel",
    "DeploymentRequest",
    "DeploymentView",
    "Publish",
    "RolloutController",
    "Status",
    "TargetView",
    "parse_request",
]

log = logging.getLogger(__name__)

ROLLOUTS = Counter("ef_fleet_rollouts_total", "Rollouts by final outcome", ["outcome"])
DESIRED_SENT = Counter("ef_fleet_desired_published_total", "Desired states published", ["kind"])

# Database rows; inside RolloutController, `list` names its own list() method.
Rows = list[dict[str, Any]]
ACTIVE = ("canary", "rolling")
Publish = Callable[[WireMessage, bool], None]

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


class RolloutController:
    """Creates deployments and moves them along as devices report."""

    def __init__(
        self,
        registry: DeviceRegistry,
        db: Database,
        publish: Publish,
        *,
        model_store: ModelStore | None = None,
        topics: Topics = Topics(),
        tick_interval_s: float | None = 1.0,
        report_deadline_s: float = 900.0,
        resolve_image: Callable[[str], str] | None = None,
    ):
        self.registry = registry
        # A tag becomes `repo@sha256:...` once, here, so every device of a rollout runs the
        # same build even if the tag moves (None: the image is kept as given).
        self.resolve_image = resolve_image
        # A phase whose devices have not all reported by then is over: a canary that never
        # answers stops (and rolls back) the rollout instead of blocking its group forever.
        self.report_deadline_s = report_deadline_s
        self.db = db
        self.publish = publish
        self.model_store = model_store
        self.tick_interval_s = tick_interval_s
        self.topics = topics
        self._lock = threading.RLock()
        self._timer: threading.Thread | None = None
        self._stop = threading.Event()
        t = db.types
        db.migrate(
            "fleet_rollout_v1",
            [
                s.format(ts=t.timestamp, bool=t.boolean, double=t.double, bigint=t.bigint)
                for s in _SCHEMA_V1
            ],
        )

    # --- creating ---------------------------------------------------------------------

    def create(self, request: DeploymentRequest | dict[str, Any]) -> DeploymentView:
        """Validate, then send the new state to the canaries; the fleet is untouched on error."""
        req = request if isinstance(request, DeploymentRequest) else parse_request(request)
        validate_group(req.group)
        devices = self.registry.devices_in_group(req.group)
        if not devices:
            raise NotFound(
                f"group {req.group!r} has no enrolled devices",
                hint="enroll devices with `edgefleet fleet enroll DEVICE --group G`",
            )
        models = [self._resolve(m) for m in req.models]
        image = self.resolve_image(req.image) if self.resolve_image else req.image
        online = {d.device_id for d in self.registry.list_devices(req.group) if d.online}
        ordered = sorted(devices, key=lambda d: (d not in online, d))
        canary_count = min(len(devices), max(1, math.ceil(len(devices) * req.canary_percent / 100)))
        canaries = ordered[:canary_count]
        dep_id = "dep-" + secrets.token_hex(6)
        spec = {
            "image": image,
            "image_requested": req.image,
            "models": [m.model_dump() for m in models],
            "config": req.config,
        }
        now = utcnow()
        with self._lock, self.db.transaction():
            self._refuse_if_active(req.group)
            try:
                self.db.execute(
                    "INSERT INTO fleet_deployments (id, grp, spec, canary_count, auto_rollback, "
                    "soak_s, min_fps, max_latency_p95_ms, status, created_at, updated_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        dep_id,
                        req.group,
                        json.dumps(spec),
                        canary_count,
                        req.auto_rollback,
                        req.soak_s,
                        req.min_fps,
                        req.max_latency_p95_ms,
                        "canary",
                        now,
                        now,
                    ),
                )
            except Conflict:
                raise self._active_conflict(req.group) from None
            for device in devices:
                previous = self.registry.desired(device)
                self.db.execute(
                    "INSERT INTO fleet_deployment_targets (deployment_id, device_id, role, state, "
                    "previous, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        dep_id,
                        device,
                        "canary" if device in canaries else "rest",
                        "pending",
                        previous.model_dump_json() if previous else None,
                        now,
                    ),
                )
        log.info(
            "rollout created",
            extra={"deployment_id": dep_id, "group": req.group, "canaries": canaries},
        )
        for device in canaries:
            self._send(dep_id, device, spec)
        self.tick()
        if self.tick_interval_s:
            self.start(self.tick_interval_s)  # soak times need a clock, not only reports
        return self.get(dep_id)

    def _resolve(self, spec: DeploymentModel) -> ModelRef:
        if spec.url and spec.sha256:
            return ModelRef(name=spec.name, version=spec.version, url=spec.url, sha256=spec.sha256)
        if self.model_store is None:
            raise InvalidInput(
                f"model {spec.name}@{spec.version} needs url and sha256 (no model store here)"
            )
        ref = self.model_store.ref(spec.name, spec.version)
        if spec.sha256 and spec.sha256 != ref.sha256:
            raise InvalidInput(
                f"model {spec.name}@{spec.version}: sha256 does not match the stored file"
            )
        return ref

    def _refuse_if_active(self, group: str) -> None:
        if self.db.query_one(
            "SELECT id FROM fleet_deployments WHERE grp = ? AND status IN ('canary', 'rolling')",
            (group,),
        ):
            raise self._active_conflict(group)

    def _active_conflict(self, group: str) -> Conflict:
        row = self.db.query_one(
            "SELECT id FROM fleet_deployments WHERE grp = ? AND status IN ('canary', 'rolling')",
            (group,),
        )
        active = row["id"] if row else "another rollout"
        return Conflict(
            f"group {group!r} already has an active rollout ({active})",
            hint="wait for it to finish, or roll it back, before starting another",
        )

    # --- publishing -------------------------------------------------------------------

    def _send(self, dep_id: str, device: str, spec: dict[str, Any]) -> None:
        desired = DesiredState(
            device_id=device,
            deployment_id=dep_id,
            image=spec["image"],
            models=[ModelRef.model_validate(m) for m in spec["models"]],
            config=spec["config"],
        )
        self._publish_desired(device, desired, kind="rollout")
        self._set_target(dep_id, device, state="sent")

    def _publish_desired(self, device: str, desired: DesiredState | None, *, kind: str) -> None:
        key = self.registry.device_key(device)
        if key is None:
            log.warning("device revoked during rollout; skipped", extra={"device_id": device})
            return
        topic = self.topics.desired(device)
        if desired is not None and self.model_store is not None:
            store = self.model_store
            models = [store.for_device(m, device, key) for m in desired.models]
            desired = desired.model_copy(update={"models": models})
        if desired is None:
            # nothing to go back to: clear the retained state; the device keeps what it runs
            self.publish(WireMessage(topic, b"", ()), True)
        else:
            self.publish(encode(desired, key, topic), True)
        self.registry.set_desired(desired, device)
        DESIRED_SENT.labels(kind).inc()

    # --- device reports and the state machine ------------------------------------------

    def on_reported(self, reported: ReportedState) -> None:
        """Record a device's report and move its deployment along."""
        if self.tick_interval_s and self._timer is None:
            self.start(self.tick_interval_s)  # e.g. a restarted orchestrator mid-rollout
        with self._lock:
            row = self.db.query_one(
                "SELECT t.role, t.state, d.status, d.spec FROM fleet_deployment_targets t "
                "JOIN fleet_deployments d ON d.id = t.deployment_id "
                "WHERE t.deployment_id = ? AND t.device_id = ?",
                (reported.deployment_id, reported.device_id),
            )
            if row is None or row["state"] == "rolled_back":
                return
            dep_id, device = reported.deployment_id, reported.device_id
            status, error = reported.status, reported.error
            image = json.loads(row["spec"])["image"]
            if status == "healthy" and image and reported.running_image != image:
                # healthy counts only for the deployment's own image, running
                status = "failed"
                error = f"reported healthy but runs {reported.running_image or 'no known image'}"
                error += f", not {image}"
            if status == "healthy":
                if row["state"] != "healthy":
                    self._set_target(dep_id, device, state="healthy", healthy_at=utcnow())
            elif status in ("failed", "rolled_back", "not_applied"):
                self._set_target(dep_id, device, state="failed", error=error)
                if row["role"] == "canary" and row["status"] == "canary":
                    self._fail(dep_id, f"canary {device} failed: {error or 'no reason'}")
                    return
                if row["role"] == "rest" and self._auto_rollback(dep_id):
                    self._restore(dep_id, device)
            elif row["state"] in ("pending", "sent"):
                self._set_target(dep_id, device, state="applying")
            self._advance(dep_id)

    def tick(self, now: datetime | None = None) -> None:
        """Evaluate soak times and bounds of every active deployment."""
        rows = self.db.query(
            "SELECT id FROM fleet_deployments WHERE status IN ('canary', 'rolling')"
        )
        for row in rows:
            with self._lock:
                self._advance(row["id"], now or utcnow())

    def start(self, interval_s: float = 1.0) -> None:
        """Call `tick` every `interval_s` on a daemon thread (until `stop`)."""
        if self._timer is not None:
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self.tick()
                except Exception:  # a bad tick must not kill the timer; it is logged
                    log.exception("rollout tick failed")

        self._timer = threading.Thread(target=loop, name="rollout-timer", daemon=True)
        self._timer.start()

    def stop(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join(timeout=5)
            self._timer = None

    def _advance(self, dep_id: str, now: datetime | None = None) -> None:
        now = now or utcnow()
        dep = self._row(dep_id)
        targets = self._targets(dep_id)
        phase_age_s = (now - dep["updated_at"]).total_seconds()
        if dep["status"] == "canary":
            canaries = [t for t in targets if t["role"] == "canary"]
            if any(t["state"] == "failed" for t in canaries):
                self._fail(dep_id, "a canary failed")
                return
            if not all(t["state"] == "healthy" for t in canaries):
                if phase_age_s > self.report_deadline_s + dep["soak_s"]:
                    silent = [t["device_id"] for t in canaries if t["state"] != "healthy"]
                    self._fail(
                        dep_id,
                        f"no healthy report from {', '.join(silent)} within "
                        f"{self.report_deadline_s:g} s",
                    )
                return
            for t in canaries:
                problem = self._out_of_bounds(dep, t)
                if problem:
                    self._fail(dep_id, f"canary {t['device_id']}: {problem}")
                    return
            soaked = all((now - t["healthy_at"]).total_seconds() >= dep["soak_s"] for t in canaries)
            if not soaked or not all(self._has_fresh_telemetry(dep, t) for t in canaries):
                return
            if not self._set_status(dep_id, "rolling", expect="canary"):
                return
            spec = json.loads(dep["spec"])
            log.info("canaries healthy; rolling out to the group", extra={"deployment_id": dep_id})
            for t in targets:
                if t["role"] == "rest":
                    self._send(dep_id, t["device_id"], spec)
            targets = self._targets(dep_id)
        if self._row(dep_id)["status"] == "rolling":
            rest = [t for t in targets if t["role"] == "rest"]
            if phase_age_s > self.report_deadline_s:
                for t in rest:
                    if t["state"] not in ("healthy", "failed", "rolled_back"):
                        self._set_target(dep_id, t["device_id"], state="failed", error="no report")
                rest = [t for t in self._targets(dep_id) if t["role"] == "rest"]
            if all(t["state"] in ("healthy", "failed", "rolled_back") for t in rest):
                failed = [t["device_id"] for t in rest if t["state"] != "healthy"]
                outcome: Status = "failed" if failed else "completed"
                error = f"failed on {', '.join(failed)}" if failed else None
                if self._set_status(dep_id, outcome, expect="rolling", error=error):
                    ROLLOUTS.labels(outcome).inc()

    def _bounded(self, dep: dict[str, Any]) -> bool:
        return dep["min_fps"] is not None or dep["max_latency_p95_ms"] is not None

    def _fresh_summary(self, dep: dict[str, Any], target: dict[str, Any]) -> dict[str, Any] | None:
        """The device's telemetry taken after it reported healthy, or None."""
        detail = self.registry.get_device(target["device_id"])
        tel = detail.telemetry
        if not tel:
            return None
        ts = datetime.fromisoformat(tel["ts"].replace("Z", "+00:00"))
        return detail.model_dump() if ts >= target["healthy_at"] else None

    def _has_fresh_telemetry(self, dep: dict[str, Any], target: dict[str, Any]) -> bool:
        return not self._bounded(dep) or self._fresh_summary(dep, target) is not None

    def _out_of_bounds(self, dep: dict[str, Any], target: dict[str, Any]) -> str | None:
        if not self._bounded(dep):
            return None
        summary = self._fresh_summary(dep, target)
        if summary is None:
            return None
        fps, p95 = summary["fps"], summary["latency_p95"]
        if dep["min_fps"] is not None and (fps is None or fps < dep["min_fps"]):
            return f"fps {fps} below the bound {dep['min_fps']}"
        limit = dep["max_latency_p95_ms"]
        if limit is not None and p95 is not None and p95 > limit:
            return f"p95 latency {p95} ms above the bound {dep['max_latency_p95_ms']} ms"
        return None

    def _fail(self, dep_id: str, reason: str) -> None:
        """Stop the rollout; with auto-rollback, the canaries get their previous state back."""
        auto = self._auto_rollback(dep_id)
        outcome: Status = "rolled_back" if auto else "halted"
        if not self._set_status(dep_id, outcome, expect="canary", error=reason):
            return
        ROLLOUTS.labels(outcome).inc()
        log.warning("rollout stopped", extra={"deployment_id": dep_id, "reason": reason})
        if auto:
            for t in self._targets(dep_id):
                if t["role"] == "canary" and t["state"] != "pending":
                    self._restore(dep_id, t["device_id"])

    def cancel(self, dep_id: str) -> DeploymentView:
        """Stop an active rollout now: every device it reached gets its previous state back.

        Conflict when the deployment has already ended.
        """
        with self._lock:
            dep = self._row(dep_id)
            if dep["status"] not in ACTIVE or not self._set_status(
                dep_id, "rolled_back", expect=dep["status"], error="cancelled by an operator"
            ):
                raise Conflict(
                    f"deployment {dep_id} is {self._row(dep_id)['status']}, not active",
                    hint="only a canary or rolling deployment can be rolled back",
                )
            ROLLOUTS.labels("cancelled").inc()
            log.warning("rollout cancelled", extra={"deployment_id": dep_id})
            for t in self._targets(dep_id):
                if t["state"] not in ("pending", "rolled_back"):
                    self._restore(dep_id, t["device_id"])
        return self.get(dep_id)

    def _restore(self, dep_id: str, device: str) -> None:
        row = self.db.query_one(
            "SELECT previous FROM fleet_deployment_targets WHERE deployment_id = ? "
            "AND device_id = ?",
            (dep_id, device),
        )
        assert row is not None  # called for the deployment's own targets
        previous = DesiredState.model_validate_json(row["previous"]) if row["previous"] else None
        if previous is not None:  # re-signed with a fresh timestamp
            previous = previous.model_copy(update={"ts": utcnow()})
        self._publish_desired(device, previous, kind="rollback")
        self._set_target(dep_id, device, state="rolled_back")

    # --- views ------------------------------------------------------------------------

    def get(self, dep_id: str) -> DeploymentView:
        dep = self._row(dep_id)
        spec = json.loads(dep["spec"])
        targets = [
            TargetView(
                device_id=t["device_id"],
                role=t["role"],
                state=t["state"],
                healthy_at=t["healthy_at"],
                error=t["error"],
            )
            for t in self._targets(dep_id)
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
        row = self.db.query_one(
            "SELECT id FROM fleet_deployments WHERE grp = ? AND status IN ('canary', 'rolling')",
            (group,),
        )
        return self.get(row["id"]) if row else None

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

    # --- storage helpers --------------------------------------------------------------

    def _row(self, dep_id: str) -> dict[str, Any]:
        row = self.db.query_one("SELECT * FROM fleet_deployments WHERE id = ?", (dep_id,))
        if row is None:
            raise NotFound(f"deployment {dep_id!r} not found")
        return row

    def _targets(self, dep_id: str) -> Rows:
        return self.db.query(
            "SELECT * FROM fleet_deployment_targets WHERE deployment_id = ? "
            "ORDER BY role, device_id",
            (dep_id,),
        )

    def _auto_rollback(self, dep_id: str) -> bool:
        return bool(self._row(dep_id)["auto_rollback"])

    def _set_status(
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

    def _set_target(
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
