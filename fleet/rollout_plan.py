"""Planning a rollout: a request checked against the fleet and made whole before anything
is sent (the group's devices, the models' files, the image pinned to its digest, which
devices are the canaries and what each ran before)."""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgefleet.fleet.deployment import DeploymentModel, DeploymentRequest, parse_request
from edgefleet.fleet.devices import validate_group
from edgefleet.fleet.models import ModelStore
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.shared.errors import InvalidInput, NotFound
from edgefleet.shared.messages import DesiredState, ModelRef


@dataclass(frozen=True)
class Plan:
    """A deployment as the book opens it: its row, its targets, and the canaries to send
    its spec to first."""

    dep_id: str
    spec: dict[str, Any]  # image, the image as requested, models, config
    deployment: dict[str, Any]  # the book's deployment row
    targets: list[tuple[str, str, DesiredState | None]]  # device, role, its state before
    canaries: list[str]


class RolloutPlanner:
    """Turns a request into a `Plan`, or a typed error with the fleet untouched."""

    def __init__(
        self,
        registry: DeviceRegistry,
        *,
        model_store: ModelStore | None = None,
        resolve_image: Callable[[str], str] | None = None,
    ) -> None:
        self.registry = registry
        self.model_store = model_store
        # A tag becomes `repo@sha256:...` once, here, so every device of a rollout runs the
        # same build even if the tag moves (None: the image is kept as given).
        self.resolve_image = resolve_image

    def plan(self, request: DeploymentRequest | dict[str, Any]) -> Plan:
        req = request if isinstance(request, DeploymentRequest) else parse_request(request)
        validate_group(req.group)
        devices = self.registry.devices_in_group(req.group)
        if not devices:
            raise NotFound(
                f"group {req.group!r} has no enrolled devices",
                hint="enroll devices with `edgefleet fleet enroll DEVICE --group G`",
            )
        models = [self.resolve(m) for m in req.models]
        image = self.resolve_image(req.image) if self.resolve_image else req.image
        online = {d.device_id for d in self.registry.list_devices(req.group) if d.online}
        ordered = sorted(devices, key=lambda d: (d not in online, d))  # online ones first
        canary_count = min(len(devices), max(1, math.ceil(len(devices) * req.canary_percent / 100)))
        canaries = ordered[:canary_count]
        spec = {
            "image": image,
            "image_requested": req.image,
            "models": [m.model_dump() for m in models],
            "config": req.config,
        }
        targets = [
            (device, "canary" if device in canaries else "rest", self.registry.desired(device))
            for device in devices
        ]
        deployment = {
            "grp": req.group,
            "spec": json.dumps(spec),
            "canary_count": canary_count,
            "auto_rollback": req.auto_rollback,
            "soak_s": req.soak_s,
            "min_fps": req.min_fps,
            "max_latency_p95_ms": req.max_latency_p95_ms,
        }
        return Plan("dep-" + secrets.token_hex(6), spec, deployment, targets, canaries)

    def resolve(self, spec: DeploymentModel) -> ModelRef:
        """The model's reference: as given with its url and sha256, else from the store
        (whose file's hash a given sha256 must match)."""
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
