"""`task: text-angle`: an OCR pipeline's 0/180° line classifier, loaded through the
pipeline."""

from __future__ import annotations

from typing import Literal

from edgefleet.shared.models.spec import ModelSpec


class TextAngleSpec(ModelSpec):
    task: Literal["text-angle"]
