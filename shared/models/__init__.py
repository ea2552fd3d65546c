"""Models: the registry of trusted files and `load_model`, the one way to get a model.

model = load_model()                     # DEFAULT_MODEL: the edge agent's, PP-OCRv6 tiny
lines = model.predict(image_rgb)         # list[edgefleet.shared.messages.Detection]
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from edgefleet.shared.errors import ConfigError
from edgefleet.shared.executor.memory import MemoryBudget
from edgefleet.shared.executor.settings import ExecutionSettings
from edgefleet.shared.models.base import Model
from edgefleet.shared.models.registry import DEFAULT_MODEL, ModelRegistry
from edgefleet.shared.models.spec import ModelSpec

__all__ = [
    "DEFAULT_MODEL",
    "ExecutionSettings",
    "Model",
    "ModelRegistry",
    "ModelSpec",
    "load_model",
]


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    settings: ExecutionSettings | None = None,
    registry: ModelRegistry | None = None,
    budget: MemoryBudget | None = None,
) -> Model:
    """Verify, load and warm up the named model; ready to `predict` when it returns.

    Raises ModelNotFound, ModelIntegrityError (hash or format refused before parsing),
    MemoryBudgetExceeded, or NoBackendAvailable — each with a hint.
    """
    settings = settings or ExecutionSettings()
    registry = registry or ModelRegistry.default()
    spec = registry.get(name)
    if spec.loader is None:
        raise ConfigError(
            f"{name} is a {spec.task} component, not a loadable model; load the pipeline that "
            "uses it (e.g. ppocr)"
        )
    module, _, attr = spec.loader.partition(":")
    model: Callable[..., Model] = getattr(importlib.import_module(module), attr)
    return model(spec, registry, settings, budget).start()
