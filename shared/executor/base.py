"""The one seam every backend implements: load bytes, run a batch, close."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from edgefleet.shared.errors import EdgefleetError


class ModelLoadError(EdgefleetError):
    """A verified file that the chosen backend cannot parse or prepare."""

    code = "model_load_failed"
    http_status = 422
    hint = "the file passed its hash check but is not a valid model for this backend"


class InferenceFailed(EdgefleetError):
    """The runtime refused a forward pass (wrong input name, shape or dtype for the model).

    Backends raise this instead of their runtime's own exception types, so callers (the
    batcher, the CLI, the HTTP handlers) meet one typed error and never a raw traceback.
    """

    code = "inference_failed"
    http_status = 500
    hint = "the model rejected its input tensor; check the manifest's input spec"


def runtime_message(exc: BaseException) -> str:
    """The first line of a runtime's error text (ONNX Runtime and torch write pages)."""
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else repr(exc)


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output as the backend sees it; None marks a dynamic axis."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str = "float32"


@dataclass(frozen=True)
class Capabilities:
    """What a loaded backend declares it can do."""

    backend: str
    device: str
    dtypes: tuple[str, ...] = ("float32",)
    dynamic_shapes: bool = True
    max_batch_size: int | None = None
    precision: str = "fp32"
    providers: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class ModelBlob:
    """Model bytes already checked against the manifest: backends parse these, never the path.

    Passing the verified bytes (not the path) means the file cannot change between the hash
    check and the parse.
    """

    name: str
    data: bytes
    sha256: str
    format: str  # "onnx", "torchscript", "torch-export", "tensorrt-engine"
    # how the model's input is prepared (INT8 calibration must feed the same tensors)
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    bgr: bool = False


@runtime_checkable
class Executor(Protocol):
    """A backend: `load` verified bytes, `infer` one batch, `close`."""

    name: str

    def load(self, blob: ModelBlob) -> None:
        """Parse and prepare the model; after this `infer` works."""

    def infer(self, batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Run one forward pass; outputs in the model's output order."""

    def close(self) -> None:
        """Free the session and its memory."""

    @property
    def capabilities(self) -> Capabilities:
        """What this backend declares (device, dtypes, batch limits)."""

    @property
    def inputs(self) -> list[TensorSpec]:
        """The model's inputs (after load)."""

    @property
    def outputs(self) -> list[TensorSpec]:
        """The model's outputs (after load)."""
