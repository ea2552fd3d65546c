"""What the host updater asks of the Docker Engine about the agent: its containers by name,
the image each runs (by its label), pulls by digest with the disk checked first, and the
pruning of older images of the agent's repository."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from edgefleet.shared.errors import EdgefleetError
from edgefleet.shared.image_ref import parse_image

log = logging.getLogger(__name__)


class Refused(EdgefleetError):
    """The request is not applied at all: the running agent was never touched."""

    code = "image_update_refused"
    http_status = 422


class AgentImages:
    def __init__(self, engine: Any, *, min_free_bytes: int, disk_path: Path | None) -> None:
        self.engine = engine
        self.min_free_bytes = min_free_bytes
        self.disk_path = disk_path

    def container(self, name: str) -> Any | None:
        import docker.errors

        try:
            return self.engine.containers.get(name)
        except docker.errors.NotFound:
            return None

    @staticmethod
    def image_of(container: Any) -> str | None:
        label: str | None = container.labels.get("io.edgefleet.image")
        return label

    def running_image(self, name: str) -> str | None:
        running = self.container(name)
        if running is None or running.status != "running":
            return None
        return self.image_of(running)

    def check_disk(self) -> None:
        path = self.disk_path or Path(self.engine.info().get("DockerRootDir", "/var/lib/docker"))
        free = shutil.disk_usage(path).free
        if free < self.min_free_bytes:
            raise Refused(
                f"not pulled: {free >> 20} MiB free on {path}, the updater keeps "
                f"{self.min_free_bytes >> 20} MiB free for an image update"
            )

    def pull(self, image: str) -> None:
        import docker.errors

        ref = parse_image(image)
        try:
            pulled = self.engine.images.pull(ref.repository, tag=ref.digest)
        except docker.errors.APIError as exc:
            raise Refused(f"pull of {image} failed: {exc.explanation or exc}") from None
        if image not in pulled.attrs.get("RepoDigests", []):
            raise Refused(f"the engine's copy of {image} has another digest")

    def prune(self, current: str, previous: str | None) -> None:
        """Remove images of the agent's repository other than the current and previous."""
        import docker.errors

        keep = {current, previous}
        repository = parse_image(current).repository
        for img in self.engine.images.list(name=repository):
            if not keep.intersection(img.attrs.get("RepoDigests", [])):
                try:
                    self.engine.images.remove(img.id, force=False)
                except docker.errors.APIError as exc:  # in use elsewhere: left, and logged
                    log.info("image kept", extra={"image": img.id, "reason": str(exc)})
