"""The seam between the agent and the fleet updater (`edgefleet.edge.updater`).

Pinned: the updater only sees this protocol, so it can be tested with its own fake and
the agent can change inside without breaking it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from edgefleet.shared.messages import ModelInfo, ModelRef, ReportedState


@runtime_checkable
class AgentControl(Protocol):
    """What a running agent lets the desired-state applier do."""

    def publish_reported(self, state: ReportedState) -> None:
        """Send `state` on the device's `reported` topic (retained, through the outbox)."""

    def swap_model(self, ref: ModelRef, path: Path) -> ModelInfo:
        """Load and warm `ref`, downloaded and checked at `path`, beside the running model;
        swap only when warmed. `current_models` reports `ref` from then on.

        Raises EdgefleetError (the old model keeps running) if loading or warm-up fails.
        """

    def current_models(self) -> list[ModelRef]:
        """The models the agent runs now."""
