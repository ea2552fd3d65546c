"""`task: text-recognition`: an OCR pipeline's recogniser (CTC) and its dictionary,
loaded through the pipeline."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from edgefleet.shared.config import Closed
from edgefleet.shared.messages import Sha256
from edgefleet.shared.models.spec import ModelSpec


class DictionaryFile(Closed):
    """A recogniser's character dictionary (one character a line), hash-pinned like a model."""

    file: str = Field(description="path, relative to the manifest, or pkg:PKG/PATH")
    sha256: Sha256


class TextRecognitionSpec(ModelSpec):
    task: Literal["text-recognition"]
    dictionary: DictionaryFile | None = Field(
        None, description="its character dictionary; none = the ONNX file's metadata"
    )
