"""The host updater: applies a deployment's image outside the agent's container.

The thing that rolls back must not be the thing that crashed, so this runs on the host
(`edgefleet edge updater`, a systemd service) and talks to the Docker Engine. The agent
hands it the desired state exactly as the fleet signed it (`request.json` in the shared
folder); the updater

1. verifies the signature and that the image is named by digest (refused otherwise);
2. checks free space on the engine's disk before pulling (refused if short);
3. pulls by digest and checks the engine holds that digest;
4. stops the running agent (kept, renamed) and starts the new one from the compose
   file's definition (`AgentContainer`);
5. waits, within the deadline, for the new one to answer /readyz and to have published
   telemetry, and not to have exited or restarted;
6. on success retires the old container and prunes images older than the previous one;
   otherwise removes the new one and starts the old one again.

Every outcome, with its reason, goes to `status.json`, which the agent reports upward.
`journal.json` records each step first, so a power cut at any point is recovered on the
next start (`recover`) to one running agent on one of the two digests.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
from prometheus_client import Counter
from pydantic import BaseModel, Field

from edgefleet.edge.agent_container import AgentContainer
from edgefleet.edge.agent_images import AgentImages, Refused
from edgefleet.edge.update_folder import UpdateFolder
from edgefleet.shared.errors import EdgefleetError, PayloadRejected
from edgefleet.shared.image_ref import is_pinned
from edgefleet.shared.messages import DesiredState
from edgefleet.shared.wire import Verifier, WireMessage

log = logging.getLogger(__name__)

OUTCOMES = Counter("ef_edge_image_updates_total", "Image updates by outcome", ["outcome"])

# `applying`: at work on it (pulling, waiting for readiness); the others are final
Outcome = Literal["applying", "running", "rolled_back", "refused"]


class NotReady(EdgefleetError):
    """The new container did not prove itself within the deadline."""

    code = "image_not_ready"
    http_status = 504


class SignedRequest(BaseModel):
    """A desired state as it came off the broker, for the updater to verify itself."""

    topic: str
    payload_b64: str
    user_properties: list[tuple[str, str]]
    content_type: str | None = None

    @classmethod
    def of(cls, wire: WireMessage) -> SignedRequest:
        return cls(
            topic=wire.topic,
            payload_b64=base64.b64encode(wire.payload).decode(),
            user_properties=list(wire.user_properties),
            content_type=wire.content_type,
        )

    def wire(self) -> WireMessage:
        return WireMessage(
            self.topic,
            base64.b64decode(self.payload_b64),
            tuple(self.user_properties),
            self.content_type,
        )


class UpdateStatus(BaseModel):
    """What the updater did with one deployment's image (`status.json`)."""

    deployment_id: str | None
    image: str | None = Field(description="the image asked for")
    outcome: Outcome
    running_image: str | None = Field(description="the image of the agent running now")
    reason: str | None = None


@dataclass
class Probe:
    """How the updater decides a new agent works: its /readyz and its /metrics."""

    ready_url: str = "http://127.0.0.1:8081/readyz"
    metrics_url: str = "http://127.0.0.1:8081/metrics"
    telemetry_metric: str = 'ef_edge_uplink_published_total{kind="telemetry"}'

    def ready(self, http: httpx.Client) -> bool:
        try:
            if http.get(self.ready_url).status_code != 200:
                return False
            text = http.get(self.metrics_url).text
        except httpx.HTTPError:
            return False
        for line in text.splitlines():
            if line.startswith(self.telemetry_metric):
                try:
                    return float(line.rsplit(" ", 1)[1]) >= 1
                except ValueError:
                    return False
        return False


class ImageUpdater:
    """Applies signed image requests to the engine; one at a time, from one host folder."""

    def __init__(
        self,
        engine: Any,
        container: AgentContainer,
        folder: Path,
        device_id: str,
        device_key: bytes,
        *,
        name: str = "edgefleet-edge",
        probe: Probe | None = None,
        deadline_s: float = 300.0,
        min_free_bytes: int = 12 << 30,
        disk_path: Path | None = None,
        poll_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.engine = engine
        self.container = container
        self.device_id = device_id
        self.verifier = Verifier(
            lambda d: device_key if d == device_id else None, max_skew_s=10 * 365 * 86400
        )  # a retained desired state may be old; the signature and the digest decide
        self.name = name
        self.probe = probe or Probe()
        self.deadline_s = deadline_s
        self.poll_s = poll_s
        self.clock = clock
        self.http = httpx.Client(timeout=httpx.Timeout(3.0))
        self.files = UpdateFolder(folder)
        self.images = AgentImages(engine, min_free_bytes=min_free_bytes, disk_path=disk_path)

    # --- the work ----------------------------------------------------------------------

    def handle_request(self) -> UpdateStatus | None:
        """Apply `request.json` if it asks for something not done yet; None if nothing to do."""
        raw = self.files.request()
        if raw is None:
            return None
        try:
            request = SignedRequest.model_validate_json(raw)
        except ValueError as exc:
            return self._finish(None, None, "refused", f"request.json is not valid: {exc}")
        done = self.files.status()
        if done and done.get("request_sha") == _sha(raw):
            return None
        return self.apply(request, request_sha=_sha(raw))

    def apply(self, request: SignedRequest, *, request_sha: str | None = None) -> UpdateStatus:
        """Verify, pull, swap and prove, or roll back; the outcome is written and returned."""
        deployment_id: str | None = None
        image: str | None = None
        try:
            desired = self._verified(request)
            deployment_id, image = desired.deployment_id, desired.image
            if (
                image == self.files.journal().get("current")
                and self.images.running_image(self.name) == image
            ):
                return self._finish(deployment_id, image, "running", None, request_sha)
            # no request_sha: an updater restarted now takes the request up again
            self._finish(deployment_id, image, "applying", None)
            self.images.check_disk()
            self.images.pull(image)
        except Refused as exc:
            return self._finish(deployment_id, image, "refused", str(exc), request_sha)
        try:
            self._swap(image)
        except EdgefleetError as exc:
            self._roll_back(image)
            return self._finish(deployment_id, image, "rolled_back", str(exc), request_sha)
        return self._finish(deployment_id, image, "running", None, request_sha)

    def _verified(self, request: SignedRequest) -> DesiredState:
        try:
            message = self.verifier.verify(request.wire()).message
        except PayloadRejected as exc:
            raise Refused(f"desired state refused: {exc}") from None
        if not isinstance(message, DesiredState) or message.device_id != self.device_id:
            raise Refused("the request is not this device's desired state")
        if not message.image or not is_pinned(message.image):
            raise Refused(f"image {message.image!r} is not named by digest (repo@sha256:...)")
        return message

    def _swap(self, image: str) -> None:
        import docker.errors

        journal = self.files.journal()
        old = self.images.container(self.name)
        previous = journal.get("current") or (self.images.image_of(old) if old else None)
        self.files.write_journal(
            {**journal, "current": previous, "pending": {"image": image, "previous": previous}},
        )
        if old is not None:
            old.stop(timeout=self.container.stop_timeout_s)
            old.rename(f"{self.name}-previous")
        try:
            new = self.engine.containers.create(**self.container.create_kwargs(image, self.name))
            new.start()
        except docker.errors.APIError as exc:
            raise NotReady(f"{image} did not start: {exc.explanation or exc}") from None
        self._wait_ready(new, image)
        self.files.write_journal({"current": image, "previous": previous, "pending": None})
        stale = self.images.container(f"{self.name}-previous")
        if stale is not None:
            stale.remove(force=True)
        self.images.prune(image, previous)

    def _wait_ready(self, container: Any, image: str) -> None:
        deadline = self.clock() + self.deadline_s
        while True:
            container.reload()
            state = container.attrs.get("State", {})
            restarts = int(container.attrs.get("RestartCount", 0))
            if state.get("Status") in ("exited", "dead") or restarts > 0:
                code = state.get("ExitCode")
                raise NotReady(f"{image} exited with {code} (restarts: {restarts}): crash loop")
            if state.get("Status") == "running" and self.probe.ready(self.http):
                return
            if self.clock() > deadline:
                raise NotReady(
                    f"{image} not ready with telemetry within {self.deadline_s:g} s (/readyz)"
                )
            time.sleep(self.poll_s)

    def _roll_back(self, image: str) -> None:
        """The new container goes; the previous one comes back under the agent's name."""
        new = self.images.container(self.name)
        if new is not None and self.images.image_of(new) != self.files.journal().get("current"):
            new.remove(force=True)
        old = self.images.container(f"{self.name}-previous")
        if old is not None:
            old.rename(self.name)
            old.start()
        journal = self.files.journal()
        self.files.write_journal({**journal, "pending": None})
        log.warning("image update rolled back", extra={"image": image})

    def recover(self) -> None:
        """After a power cut or a kill: finish or undo a pending swap, so one agent runs."""
        journal = self.files.journal()
        if journal.get("pending"):
            new = self.images.container(self.name)
            new_image = self.images.image_of(new) if new else None
            if new_image == journal["pending"]["image"]:
                new.remove(force=True)  # type: ignore[union-attr]  # never proved itself
            self._roll_back(journal["pending"]["image"])
            self._finish(
                None,
                journal["pending"]["image"],
                "rolled_back",
                "the updater stopped during the update; the previous image runs again",
            )
        running = self.images.container(self.name)
        if running is not None and running.status != "running":
            running.start()

    def _finish(
        self,
        deployment_id: str | None,
        image: str | None,
        outcome: Outcome,
        reason: str | None,
        request_sha: str | None = None,
    ) -> UpdateStatus:
        status = UpdateStatus(
            deployment_id=deployment_id,
            image=image,
            outcome=outcome,
            running_image=self.images.running_image(self.name),
            reason=reason,
        )
        self.files.write_status({**status.model_dump(), "request_sha": request_sha})
        if outcome != "applying":
            OUTCOMES.labels(outcome).inc()
        level = logging.INFO if outcome in ("applying", "running") else logging.WARNING
        log.log(level, "image update %s", outcome, extra=status.model_dump())
        return status


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
