"""The edge model seam: what the pipeline needs from a loaded model, and how it is loaded."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from edgefleet.edge.settings import EdgeSettings, ModelSettings
from edgefleet.shared.errors import EdgefleetError
from edgefleet.shared.executor.settings import BatcherSettings, ExecutionSettings
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


def usable_cores() -> int:
    """The cores this process may run on: a container limited to a cpuset (docker
    --cpuset-cpus) sees the host's count in os.cpu_count(), and N threads per worker there
    would fight over the few cores it has."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 2


def edge_execution(workers: int) -> ExecutionSettings:
    """The edge's executor defaults: `workers` runs side by side, the cores split between,
    and ONNX Runtime's idle threads not spinning.

    Measured on 2 shared cores (bench/bench_edge.py, one run, A/B): a spinning session burns
    ~150 ms of CPU per frame instead of ~60 and runs 3x slower, because its idle threads
    compete with decode, the post stage and the machine's other work. Without spinning, one
    worker spreading each frame over every core (the default, `infer_workers: 1`) has
    0.5-0.7x the p95 of two single-threaded workers; those overlap OCR's single-threaded
    parts and have more throughput on otherwise idle cores (x1.44 in the quietest run):
    `infer_workers: 2` trades p95 for it. The batcher still queues requests (several
    streams share the model) but sends a batch as soon as one waits.
    """
    cores = usable_cores()
    return ExecutionSettings(
        intra_op_threads=max(1, cores // workers),
        spinning=False,  # decode, post and the other workers share these cores
        batching=BatcherSettings(workers=workers, preferred_batch_size=1, max_delay_ms=2.0),
    )


def open_model(settings: ModelSettings, workers: int = 1) -> Predictor:
    """Load and warm the configured model through the shared registry."""
    from edgefleet.shared.models import load_model  # the registry pulls in the executor backends

    return load_model(name=settings.name, settings=settings.execution or edge_execution(workers))


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
    pipelines = [
        s.name for s in registry.specs() if s.ocr and ref.name in (s.ocr.det, s.ocr.rec, s.ocr.cls)
    ]
    target = settings.model.name if settings.model.name in pipelines else ref.name
    execution = settings.model.execution or edge_execution(settings.pipeline.infer_workers)
    try:
        return load_model(target, settings=execution, registry=registry)
    except EdgefleetError:
        raise
    except Exception as exc:  # a backend's own error: wrap it, the old model stays
        raise EdgefleetError(f"loading {ref.name} from {path} failed: {exc}") from exc
