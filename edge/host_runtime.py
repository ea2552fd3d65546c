"""`runtime.kind: host`: the agent's side of the host updater (`edgefleet edge updater`).

The agent has no docker socket. It hands the desired state, as the fleet signed it, to the
updater through a folder both see (`request.json`), and reads what the updater did from
`status.json`. The updater stops this container to start the new one, so "healthy" for an
image is reported by the agent of that image once the updater has proved it (ready, with
telemetry); a refused or rolled-back image is reported failed, with the updater's reason,
by the agent that runs again.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from edgefleet.edge.image_update import SignedRequest, UpdateStatus
from edgefleet.edge.settings import RuntimeSettings
from edgefleet.edge.updater import HandedOver, NullRuntime, Runtime, UpdateFailed, atomic_write
from edgefleet.shared.wire import WireMessage


class HostRuntime:
    """Hands images to the host updater; `current_image` is what the updater confirmed."""

    def __init__(
        self,
        folder: Path,
        *,
        own_image: str | None = None,
        answer_timeout_s: float = 900.0,
        poll_s: float = 1.0,
    ):
        self.folder = Path(folder)
        # the updater names the image it started in the container's environment
        self.own_image = own_image if own_image is not None else os.environ.get("EDGEFLEET_IMAGE")
        self.answer_timeout_s = answer_timeout_s
        self.poll_s = poll_s
        self._signed: dict[str, WireMessage] = {}
        self._stopping = threading.Event()

    def hand_over(self, deployment_id: str, wire: WireMessage) -> None:
        """Keep the signed desired state of `deployment_id` for the updater to verify."""
        self._signed = {deployment_id: wire}

    def status(self) -> UpdateStatus | None:
        try:
            data = json.loads((self.folder / "status.json").read_text())
            return UpdateStatus.model_validate(data)
        except (OSError, ValueError):
            return None

    def current_image(self) -> str | None:
        status = self.status()
        if status is None or self.own_image is None or status.running_image != self.own_image:
            return None
        return self.own_image

    def apply(self, image: str, config: dict[str, Any]) -> None:
        """Ask the updater for `image` and wait for its answer (or for being replaced)."""
        found = [(dep, w) for dep, w in self._signed.items() if _image_of(w) == image]
        if not found:
            raise UpdateFailed(f"no signed desired state names {image}: nothing to hand over")
        deployment_id, wire = found[0]
        atomic_write(
            self.folder / "request.json", SignedRequest.of(wire).model_dump_json().encode()
        )
        deadline = time.monotonic() + self.answer_timeout_s
        while not self._stopping.is_set():
            status = self.status()
            if status is not None and (status.deployment_id, status.image) == (
                deployment_id,
                image,
            ):
                if status.outcome == "running" and status.running_image == self.own_image:
                    return  # this agent is the new image, proved by the updater
                if status.outcome in ("refused", "rolled_back"):
                    outcome, reason = status.outcome, status.reason
                    raise UpdateFailed(f"the host updater {outcome} {image}: {reason}")
                # at work (a pull may take long), or swapped: the updater stops this agent
                deadline = time.monotonic() + self.answer_timeout_s
            elif time.monotonic() > deadline:
                raise UpdateFailed(
                    f"the host updater did not take up {image} within {self.answer_timeout_s:g} s"
                )
            self._stopping.wait(self.poll_s)  # the updater answers through a file
        raise HandedOver(f"{image} is with the host updater; this agent is stopping")

    def stop_waiting(self) -> None:
        """The agent is stopping (often: the updater replacing it): report nothing more."""
        self._stopping.set()


def _image_of(wire: WireMessage) -> str | None:
    try:
        image = json.loads(wire.payload).get("image")
    except ValueError:
        return None
    return image if isinstance(image, str) else None


def runtime_from_settings(settings: RuntimeSettings, state_dir: Path) -> Runtime:
    """The runtime a device's settings name (`runtime.kind`)."""
    if settings.kind == "host":
        return HostRuntime(settings.updater_dir)
    return NullRuntime()
