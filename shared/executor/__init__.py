"""The execution layer: backends behind one `Executor` protocol, memory budget, batching.

It only runs forward passes; loading goes through `shared.models` (hash-checked files).
"""

from __future__ import annotations

from shared.executor.base import (
    Capabilities,
    Executor,
    InferenceFailed,
    ModelBlob,
    ModelLoadError,
    TensorSpec,
)
from shared.executor.batcher import BatcherClosed, DynamicBatcher
from shared.executor.memory import Footprint, MemoryBudget, MemorySnapshot
from shared.executor.registry import create_executor, probe_backends
from shared.executor.selection import NoBackendAvailable, explain, select_backend
from shared.executor.settings import (
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
