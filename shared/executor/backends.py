"""The backends: each declared in its own module (`BACKENDS`, see `plugin.Backend`), named
here once. A backend's module imports no runtime at its top, so TensorRT or torch loads
only when that backend is built."""

from __future__ import annotations

import functools
import importlib
import logging

from edgefleet.shared.executor.base import Executor
from edgefleet.shared.executor.plugin import Backend, BackendTraits
from edgefleet.shared.executor.settings import ExecutionSettings

log = logging.getLogger(__name__)

# One line per backend module: adding a backend is its file and its line here.
MODULES = [
    "edgefleet.shared.executor.tensorrt_backend",
    "edgefleet.shared.executor.onnxruntime_backend",
    "edgefleet.shared.executor.torch_backend",
]


@functools.lru_cache(maxsize=1)
def backends() -> dict[str, Backend]:
    """Every declared backend by name, in the shipped preference order (cached)."""
    declared: list[Backend] = []
    for module in MODULES:
        declared.extend(importlib.import_module(module).BACKENDS)
    names = [b.name for b in declared]
    if len(set(names)) != len(names):
        raise RuntimeError(f"two backends share a name: {sorted(names)}")
    return {b.name: b for b in sorted(declared, key=lambda b: b.rank)}


def traits(name: str) -> BackendTraits | None:
    """What backend `name` runs; None for a name no module declares."""
    backend = backends().get(name)
    return backend.traits if backend else None


def default_order() -> list[str]:
    """The shipped backend preference: every backend, best first."""
    return list(backends())


def preference(settings: ExecutionSettings) -> list[str]:
    """The backends `settings` prefers, best first: its own list, else the shipped order."""
    return default_order() if settings.backends is None else settings.backends


def create_executor(name: str, settings: ExecutionSettings) -> Executor:
    """Build the chosen backend's executor (its runtime is imported now, not before)."""
    known = backends()
    if name not in known:
        raise KeyError(f"unknown backend {name!r}; known: {', '.join(known)}")
    return known[name].build(settings)


@functools.lru_cache(maxsize=1)
def probe_backends() -> dict[str, str | None]:
    """Which backends are installed here: name -> None (worth a proof) or the reason not.

    Each backend probes without importing TensorRT or torch (find_spec; ONNX Runtime is
    asked which providers its build carries). Whether a GPU backend really runs is not
    guessed here: `proof.prove` loads a tiny model on it before it is chosen. Cached.
    """
    return {name: backend.probe() for name, backend in backends().items()}


def gpu_reason() -> str | None:
    """None when NVML sees a GPU (or this is a Jetson, where NVML is absent), else why not:
    the hint added to a GPU backend's failed proof."""
    from edgefleet.shared.executor.memory import is_jetson

    if is_jetson():
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # NVML raises its own error types, or ImportError
        return f"no NVIDIA GPU visible (NVML: {type(exc).__name__})"
    return None if count > 0 else "NVML sees no GPU"
