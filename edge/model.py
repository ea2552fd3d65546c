"""The edge model seam: what the pipeline needs from a loaded model, and how it is loaded."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from edge.settings import ModelSettings
from shared.messages import Detection, ModelInfo


@runtime_checkable
class Predictor(Protocol):
    """A loaded, warmed model; `predict` is thread-safe (the executor batches callers)."""

    @property
    def info(self) -> ModelInfo:
        """Name, version, sha256, backend and precision (reported in cases and telemetry)."""

    def predict(self, rgb: np.ndarray) -> list[Detection]:
        """Results for one RGB uint8 HxWx3 image, in its pixel coordinates."""

    def close(self) -> None:
        """Free the model."""


def open_model(settings: ModelSettings) -> Predictor:
    """Load and warm the configured model through the shared registry."""
    from shared.models import load_model  # the registry pulls in the executor backends

    return load_model(name=settings.name, settings=settings.execution)
