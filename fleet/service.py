"""The fleet as the orchestrator hosts it: the one module the cloud imports from the fleet.

The orchestrator keeps the device registry in its own store, runs the rollouts, serves the
model files devices download and mounts the fleet's routes; everything else in the fleet
is its own business (lint-imports holds the cloud to this module).
"""

from __future__ import annotations

from edgefleet.fleet.api import build_router
from edgefleet.fleet.models import ModelStore
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.fleet.rollout import RolloutController

__all__ = ["DeviceRegistry", "ModelStore", "RolloutController", "build_router"]
