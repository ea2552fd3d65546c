"""Explicit backend registry: names map to lazy imports, so TensorRT loads only when chosen."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
from collections.abc import Callable

from edgefleet.shared.executor.base import Executor
from edgefleet.shared.executor.settings import ExecutionSettings

log = logging.getLogger(__name__)

_ORT = "edgefleet.shared.executor.onnxruntime_backend"

# name -> (module, factory attribute, keyword arguments)
BACKENDS: dict[str, tuple[str, str, dict]] = {
    "onnxruntime-cpu": (_ORT, "OnnxRuntimeExecutor", {"device": "cpu"}),
    "onnxruntime-cuda": (_ORT, "OnnxRuntimeExecutor", {"device": "cuda"}),
    "onnxruntime-tensorrt": (_ORT, "OnnxRuntimeExecutor", {"device": "tensorrt"}),
    "tensorrt": ("edgefleet.shared.executor.tensorrt_backend", "TensorRTExecutor", {}),
    "torch-cpu": ("edgefleet.shared.executor.torch_backend", "TorchExecutor", {"device": "cpu"}),
    "torch-cuda": ("edgefleet.shared.executor.torch_backend", "TorchExecutor", {"device": "cuda"}),
}


def create_executor(name: str, settings: ExecutionSettings) -> Executor:
    """Import the chosen backend's module now (not before) and build it."""
    if name not in BACKENDS:
        raise KeyError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    module_name, attr, kwargs = BACKENDS[name]
    factory: Callable[..., Executor] = getattr(importlib.import_module(module_name), attr)
    return factory(settings, **kwargs)


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@functools.lru_cache(maxsize=1)
def probe_backends() -> dict[str, str | None]:
    """Which backends are installed here: name -> None (worth a proof) or the reason not.

    Probes without importing TensorRT or torch (find_spec), and asks ONNX Runtime which
    providers its build carries. Whether a GPU backend really runs is not guessed here:
    `proof.prove` loads a tiny model on it before it is chosen. Cached.
    """
    out: dict[str, str | None] = {}
    try:
        import onnxruntime as ort

        providers = set(ort.get_available_providers())
    except ImportError:
        providers = set()
    has_cpu = "CPUExecutionProvider" in providers
    out["onnxruntime-cpu"] = None if has_cpu else "onnxruntime not installed"
    for name, provider in (
        ("onnxruntime-cuda", "CUDAExecutionProvider"),
        ("onnxruntime-tensorrt", "TensorrtExecutionProvider"),
    ):
        out[name] = None if provider in providers else f"this onnxruntime build has no {provider}"
    out["tensorrt"] = None if _installed("tensorrt") else "TensorRT (tensorrt) not installed"
    torch_ok = None if _installed("torch") else "torch not installed"
    out["torch-cpu"] = torch_ok
    out["torch-cuda"] = torch_ok
    return out


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
