"""The model tasks: each a manifest entry of its own (one file here), gathered into one
union on `task`. Adding a task is its file and its line in `ModelEntry`."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from edgefleet.shared.models.tasks.classification import ClassificationSpec
from edgefleet.shared.models.tasks.ocr import OcrOptions, OcrSpec
from edgefleet.shared.models.tasks.text_angle import TextAngleSpec
from edgefleet.shared.models.tasks.text_detection import TextDetectionSpec
from edgefleet.shared.models.tasks.text_recognition import DictionaryFile, TextRecognitionSpec
from edgefleet.shared.models.tasks.yolo import YoloOptions, YoloSpec

ModelEntry = Annotated[
    OcrSpec
    | TextDetectionSpec
    | TextRecognitionSpec
    | TextAngleSpec
    | YoloSpec
    | ClassificationSpec,
    Field(discriminator="task"),
]

__all__ = [
    "ClassificationSpec",
    "DictionaryFile",
    "ModelEntry",
    "OcrOptions",
    "OcrSpec",
    "TextAngleSpec",
    "TextDetectionSpec",
    "TextRecognitionSpec",
    "YoloOptions",
    "YoloSpec",
]
