"""A manifest entry: what every model has (its file, hash, input), whatever its task."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from edgefleet.shared.config import Closed
from edgefleet.shared.executor.settings import TritonServing
from edgefleet.shared.messages import Sha256

_SUFFIX_FORMATS = {
    ".onnx": "onnx",
    ".engine": "tensorrt-engine",
    ".plan": "tensorrt-engine",
    ".ts": "torchscript",
    ".torchscript": "torchscript",
    ".pt2": "torch-export",
}
_PICKLE_SUFFIXES = {".pkl", ".pickle", ".pt", ".pth", ".bin", ".ckpt", ".joblib", ".npy"}


class InputSpec(Closed):
    """How a model wants its input tensor."""

    name: str | None = Field(None, description="input tensor name; none = the first input")
    layout: Literal["NCHW", "NHWC"] = Field("NCHW", description="tensor layout")
    channels: int = Field(3, ge=1, le=4, description="colour channels")
    height: int | None = Field(None, ge=1, description="fixed input height; none = dynamic")
    width: int | None = Field(None, ge=1, description="fixed input width; none = dynamic")
    color: Literal["RGB", "BGR"] = Field("RGB", description="channel order the model expects")
    scale: float = Field(1 / 255, gt=0, description="pixel values are multiplied by this first")
    pad_value: int = Field(114, ge=0, le=255, description="letterbox padding colour")


class ModelSpec(Closed):
    """What every manifest entry has; each task's entry (`tasks/`) adds its own fields.

    `loader` names the class that loads a task's entry (`module:Class`, imported only when
    one is loaded); None for a component, which is loaded through its pipeline."""

    loader: ClassVar[str | None] = None

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.-]+$")
    version: str = Field(min_length=1, max_length=64)
    task: str
    file: str | None = Field(None, description="path, relative to the manifest, or pkg:PKG/PATH")
    sha256: Sha256 | None = None
    input: InputSpec = Field(default_factory=InputSpec)
    mean: list[float] = Field(default_factory=lambda: [0.0, 0.0, 0.0])
    std: list[float] = Field(default_factory=lambda: [1.0, 1.0, 1.0])
    labels: list[str] | None = None
    triton: TritonServing | None = Field(
        None,
        description="the forward pass runs on this Triton server instead of in process (on "
        "a pipeline: each of its components, by its own name); none = in process",
    )
    base_dir: Path | None = Field(None, exclude=True, description="set from the manifest")

    @property
    def format(self) -> str:
        """The file format, from the suffix; pipelines (ocr) run ONNX components."""
        if self.file is None:
            return "onnx"
        suffix = Path(self.file).suffix.lower()
        if suffix in _PICKLE_SUFFIXES:
            return "pickle"
        return _SUFFIX_FORMATS.get(suffix, "unknown")

    def components(self) -> list[str]:
        """The manifest entries a pipeline runs, by name; none for a model of one file."""
        return []
