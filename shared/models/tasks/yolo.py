"""`task: yolo`: YOLO v5 / v8 / v11 boxes."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from edgefleet.shared.config import Closed
from edgefleet.shared.models.spec import ModelSpec


class YoloOptions(Closed):
    layout: Literal["auto", "v5", "v8"] = Field(
        "auto", description="output layout: v5 (N,5+C) with objectness, v8/v11 (4+C,N)"
    )
    conf_threshold: float = Field(0.25, ge=0, le=1, description="minimum class score")
    iou_threshold: float = Field(0.45, gt=0, le=1, description="NMS IoU threshold")
    max_det: int = Field(300, ge=1, description="boxes kept per image")


class YoloSpec(ModelSpec):
    task: Literal["yolo"]
    loader: ClassVar[str | None] = "edgefleet.shared.models.vision:YoloModel"
    yolo: YoloOptions = Field(default_factory=YoloOptions)
