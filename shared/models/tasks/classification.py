"""`task: classification`: the top labels of each image."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from edgefleet.shared.models.spec import ModelSpec


class ClassificationSpec(ModelSpec):
    task: Literal["classification"]
    loader: ClassVar[str | None] = "edgefleet.shared.models.vision:ClassificationModel"
    top_k: int = Field(5, ge=1, description="labels returned per image")
