"""The execution layer: backends behind one `Executor` protocol, memory budget, batching.

It only runs forward passes; loading goes through `edgefleet.shared.models` (hash-checked files).
"""

from __future__ import annotations

from edgefleet.shared.executor.backends import create_executor, probe_backends
from edgefleet.shared.executor.base import (
    Capabilities,
    Executor,
    InferenceFailed,
    ModelBlob,
    ModelLoadError,
    TensorSpec,
)
from edgefleet.shared.executor.batcher import BatcherClosed, DynamicBatcher
from edgefleet.shared.executor.memory import Footprint, MemoryBudget, MemorySnapshot
from edgefleet.shared.executor.selection import NoBackendAvailable, explain, select_backend
from edgefleet.shared.executor.settings import (
    BatcherSettings,
    ExecutionSettings,
    MemorySettings,
    TensorRTSettings,
)

__all__ = [
    "BatcherClosed",
    "BatcherSettings",
    "Capabilities",
    "DynamicBatcher",
    "ExecutionSettings",
    "Executor",
    "Footprint",
    "InferenceFailed",
    "MemoryBudget",
    "MemorySettings",
    "MemorySnapshot",
    "ModelBlob",
    "ModelLoadError",
    "NoBackendAvailable",
    "TensorRTSettings",
    "TensorSpec",
    "create_executor",
    "explain",
    "probe_backends",
    "select_backend",
]
