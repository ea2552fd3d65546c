"""`task: classification`: the top labels of each image."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from edgefleet.shared.models.spec import ModelSpec

if TYPE_CHECKING:
    from edgefleet.shared.executor.memory import MemoryBudget
    from edgefleet.shared.executor.settings import ExecutionSettings
    from edgefleet.shared.models.base import Model
    from edgefleet.shared.models.registry import ModelRegistry


class ClassificationSpec(ModelSpec):
    task: Literal["classification"]
    top_k: int = Field(5, ge=1, description="labels returned per image")

    def build(
        self, registry: ModelRegistry, settings: ExecutionSettings, budget: MemoryBudget | None
    ) -> Model:
        from edgefleet.shared.models.vision import ClassificationModel

        return ClassificationModel(self, registry, settings, budget)
