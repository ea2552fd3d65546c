"""`task: yolo`: YOLO v5 / v8 / v11 boxes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from edgefleet.shared.config import Closed
from edgefleet.shared.models.spec import ModelSpec

if TYPE_CHECKING:
    from edgefleet.shared.executor.memory import MemoryBudget
    from edgefleet.shared.executor.settings import ExecutionSettings
    from edgefleet.shared.models.base import Model
    from edgefleet.shared.models.registry import ModelRegistry


class YoloOptions(Closed):
    layout: Literal["auto", "v5", "v8"] = Field(
        "auto", description="output layout: v5 (N,5+C) with objectness, v8/v11 (4+C,N)"
    )
    conf_threshold: float = Field(0.25, ge=0, le=1, description="minimum class score")
    iou_threshold: float = Field(0.45, gt=0, le=1, description="NMS IoU threshold")
    max_det: int = Field(300, ge=1, description="boxes kept per image")


class YoloSpec(ModelSpec):
    task: Literal["yolo"]
    yolo: YoloOptions = Field(default_factory=YoloOptions)

    def build(
        self, registry: ModelRegistry, settings: ExecutionSettings, budget: MemoryBudget | None
    ) -> Model:
        from edgefleet.shared.models.vision import YoloModel

        return YoloModel(self, registry, settings, budget)
