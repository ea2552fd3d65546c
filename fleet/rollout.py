"""Rollouts: a desired state to a group, canaries first, the rest after a healthy soak.

A deployment (image tag + model refs + pipeline config, aimed at a group) goes to its
canaries as a signed, retained `DesiredState` on `ef/v1/{device}/desired`. The devices
answer on `reported`; `on_reported` and `tick` move the deployment along:

    canary ──all canaries healthy for soak_s, within bounds──▶ rolling ──all healthy──▶ completed
      │                                                          └─ some failed ─▶ failed
      └─ a canary failed / out of bounds ─▶ rolled_back (auto-rollback: canaries get their
                                            previous state back) or halted (no auto-rollback)

The pieces: the plan of a request (`RolloutPlanner`), the book of deployments and targets
(`RolloutBook`), the way a desired state goes out (`DesiredPublisher`) and the canaries'
bounds (`CanaryBounds`). State lives in the database, so a restarted orchestrator (or
another replica) carries on where this one stopped.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from prometheus_client import Counter

from edgefleet.fleet.bounds import CanaryBounds
from edgefleet.fleet.deployment import DeploymentRequest, DeploymentView, Status
from edgefleet.fleet.desired import DesiredPublisher, Publish
from edgefleet.fleet.models import ModelStore
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.fleet.rollout_book import ACTIVE, RolloutBook
from edgefleet.fleet.rollout_plan import RolloutPlanner
from edgefleet.shared.db import Database
from edgefleet.shared.errors import Conflict
from edgefleet.shared.messages import DesiredState, ModelRef, ReportedState, utcnow
from edgefleet.shared.topics import Topics

log = logging.getLogger(__name__)

ROLLOUTS = Counter("ef_fleet_rollouts_total", "Rollouts by final outcome", ["outcome"])


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
        self.planner = RolloutPlanner(
            registry, model_store=model_store, resolve_image=resolve_image
        )
        # A phase whose devices have not all reported by then is over: a canary that never
        # answers stops (and rolls back) the rollout instead of blocking its group forever.
        self.report_deadline_s = report_deadline_s
        self.tick_interval_s = tick_interval_s
        self.book = RolloutBook(db)
        self.desired = DesiredPublisher(registry, publish, topics=topics, model_store=model_store)
        self.bounds = CanaryBounds(registry)
        self._lock = threading.RLock()
        self._timer: threading.Thread | None = None
        self._stop = threading.Event()

    # --- creating ---------------------------------------------------------------------

    def create(self, request: DeploymentRequest | dict[str, Any]) -> DeploymentView:
        """Validate, then send the new state to the canaries; the fleet is untouched on error."""
        plan = self.planner.plan(request)
        with self._lock:
            self.book.open(plan.dep_id, plan.deployment, plan.targets)
        log.info(
            "rollout created",
            extra={
                "deployment_id": plan.dep_id,
                "group": plan.deployment["grp"],
                "canaries": plan.canaries,
            },
        )
        for device in plan.canaries:
            self._send(plan.dep_id, device, plan.spec)
        self.tick()
        if self.tick_interval_s:
            self.start(self.tick_interval_s)  # soak times need a clock, not only reports
        return self.get(plan.dep_id)

    # --- device reports and the state machine ------------------------------------------

    def _send(self, dep_id: str, device: str, spec: dict[str, Any]) -> None:
        desired = DesiredState(
            device_id=device,
            deployment_id=dep_id,
            image=spec["image"],
            models=[ModelRef.model_validate(m) for m in spec["models"]],
            config=spec["config"],
        )
        self.desired.send(device, desired, kind="rollout")
        self.book.set_target(dep_id, device, state="sent")

    def on_reported(self, reported: ReportedState) -> None:
        """Record a device's report and move its deployment along."""
        if self.tick_interval_s and self._timer is None:
            self.start(self.tick_interval_s)  # e.g. a restarted orchestrator mid-rollout
        with self._lock:
            row = self.book.target(reported.deployment_id, reported.device_id)
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
                    self.book.set_target(dep_id, device, state="healthy", healthy_at=utcnow())
            elif status in ("failed", "rolled_back", "not_applied"):
                self.book.set_target(dep_id, device, state="failed", error=error)
                if row["role"] == "canary" and row["status"] == "canary":
                    self._fail(dep_id, f"canary {device} failed: {error or 'no reason'}")
                    return
                if row["role"] == "rest" and self.book.auto_rollback(dep_id):
                    self._restore(dep_id, device)
            elif row["state"] in ("pending", "sent"):
                self.book.set_target(dep_id, device, state="applying")
            self._advance(dep_id)

    def tick(self, now: datetime | None = None) -> None:
        """Evaluate soak times and bounds of every active deployment."""
        for dep_id in self.book.active_ids():
            with self._lock:
                self._advance(dep_id, now or utcnow())

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
        dep = self.book.row(dep_id)
        targets = self.book.targets(dep_id)
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
                problem = self.bounds.problem(dep, t)
                if problem:
                    self._fail(dep_id, f"canary {t['device_id']}: {problem}")
                    return
            soaked = all((now - t["healthy_at"]).total_seconds() >= dep["soak_s"] for t in canaries)
            if not soaked or not all(self.bounds.measured(dep, t) for t in canaries):
                return
            if not self.book.set_status(dep_id, "rolling", expect="canary"):
                return
            spec = json.loads(dep["spec"])
            log.info("canaries healthy; rolling out to the group", extra={"deployment_id": dep_id})
            for t in targets:
                if t["role"] == "rest":
                    self._send(dep_id, t["device_id"], spec)
            targets = self.book.targets(dep_id)
        if self.book.row(dep_id)["status"] == "rolling":
            rest = [t for t in targets if t["role"] == "rest"]
            if phase_age_s > self.report_deadline_s:
                for t in rest:
                    if t["state"] not in ("healthy", "failed", "rolled_back"):
                        self.book.set_target(
                            dep_id, t["device_id"], state="failed", error="no report"
                        )
                rest = [t for t in self.book.targets(dep_id) if t["role"] == "rest"]
            if all(t["state"] in ("healthy", "failed", "rolled_back") for t in rest):
                failed = [t["device_id"] for t in rest if t["state"] != "healthy"]
                outcome: Status = "failed" if failed else "completed"
                error = f"failed on {', '.join(failed)}" if failed else None
                if self.book.set_status(dep_id, outcome, expect="rolling", error=error):
                    ROLLOUTS.labels(outcome).inc()

    def _fail(self, dep_id: str, reason: str) -> None:
        """Stop the rollout; with auto-rollback, the canaries get their previous state back."""
        auto = self.book.auto_rollback(dep_id)
        outcome: Status = "rolled_back" if auto else "halted"
        if not self.book.set_status(dep_id, outcome, expect="canary", error=reason):
            return
        ROLLOUTS.labels(outcome).inc()
        log.warning("rollout stopped", extra={"deployment_id": dep_id, "reason": reason})
        if auto:
            for t in self.book.targets(dep_id):
                if t["role"] == "canary" and t["state"] != "pending":
                    self._restore(dep_id, t["device_id"])

    def cancel(self, dep_id: str) -> DeploymentView:
        """Stop an active rollout now: every device it reached gets its previous state back.

        Conflict when the deployment has already ended.
        """
        with self._lock:
            dep = self.book.row(dep_id)
            if dep["status"] not in ACTIVE or not self.book.set_status(
                dep_id, "rolled_back", expect=dep["status"], error="cancelled by an operator"
            ):
                raise Conflict(
                    f"deployment {dep_id} is {self.book.row(dep_id)['status']}, not active",
                    hint="only a canary or rolling deployment can be rolled back",
                )
            ROLLOUTS.labels("cancelled").inc()
            log.warning("rollout cancelled", extra={"deployment_id": dep_id})
            for t in self.book.targets(dep_id):
                if t["state"] not in ("pending", "rolled_back"):
                    self._restore(dep_id, t["device_id"])
        return self.get(dep_id)

    def _restore(self, dep_id: str, device: str) -> None:
        previous = self.book.previous(dep_id, device)
        if previous is not None:  # re-signed with a fresh timestamp
            previous = previous.model_copy(update={"ts": utcnow()})
        self.desired.send(device, previous, kind="rollback")
        self.book.set_target(dep_id, device, state="rolled_back")

    # --- views ------------------------------------------------------------------------

    def get(self, dep_id: str) -> DeploymentView:
        return self.book.get(dep_id)

    def list(self, limit: int = 20) -> list[DeploymentView]:
        return self.book.list(limit)

    def active(self, group: str) -> DeploymentView | None:
        return self.book.active(group)
