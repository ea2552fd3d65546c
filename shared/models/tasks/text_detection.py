"""`task: text-detection`: an OCR pipeline's detector (DB), loaded through the pipeline."""

from __future__ import annotations

from typing import Literal

from edgefleet.shared.models.spec import ModelSpec


class TextDetectionSpec(ModelSpec):
    task: Literal["text-detection"]
