"""The edge model seam: what the pipeline needs from a loaded model, and how it is loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from edgefleet.edge.execution import edge_execution
from edgefleet.edge.settings import EdgeSettings, ModelSettings
from edgefleet.shared.errors import EdgefleetError
from edgefleet.shared.executor.settings import ExecutionSettings
from edgefleet.shared.messages import Detection, ModelInfo, ModelRef


@runtime_checkable
class Predictor(Protocol):
    """A loaded, warmed model; `predict` is thread-safe (the executor batches callers)."""

    @property
    def info(self) -> ModelInfo:
        """Name, version, sha256, backend and precision (reported in cases and telemetry)."""

    def predict(self, image: np.ndarray, *, fmt: str = "rgb") -> list[Detection]:
        """Results for one image in pixel format `fmt` (rgb, bgr, nv12, i420), in its
        pixel coordinates."""

    def close(self) -> None:
        """Free the model."""


def open_model(settings: ModelSettings, workers: int = 1) -> Predictor:
    """Load and warm the configured model through the shared registry."""
    from edgefleet.shared.models import load_model  # the registry pulls in the executor backends

    return load_model(name=settings.name, settings=settings.execution or edge_execution(workers))


def model_execution(settings: EdgeSettings) -> ExecutionSettings:
    """The executor settings the agent's model loads with (and its self-test proves)."""
    return settings.model.execution or edge_execution(settings.pipeline.infer_workers)


def load_deployed(ref: ModelRef, path: Path, settings: EdgeSettings) -> Predictor:
    """Load and warm the deployed file `path` of `ref` in place of its manifest entry.

    When `ref` is a component of the configured OCR pipeline (its detector, say), the
    pipeline is what is loaded, with the new component. Raises EdgefleetError if loading
    or warm-up fails (a backend's own error is wrapped).
    """
    from edgefleet.shared.models import load_model
    from edgefleet.shared.models.registry import ModelRegistry

    registry = ModelRegistry.default()
    spec = registry.get(ref.name)
    if spec.file is None:
        raise EdgefleetError(
            f"{ref.name} is a pipeline of several files; deploy its components instead"
        )
    path = Path(path).resolve()
    registry.add(
        spec.model_copy(update={"file": path.name, "sha256": ref.sha256, "base_dir": path.parent})
    )
    pipelines = [s.name for s in registry.specs() if ref.name in s.components()]
    target = settings.model.name if settings.model.name in pipelines else ref.name
    try:
        return load_model(target, settings=model_execution(settings), registry=registry)
    except EdgefleetError:
        raise
    except Exception as exc:  # a backend's own error: wrap it, the old model stays
        raise EdgefleetError(f"loading {ref.name} from {path} failed: {exc}") from exc
