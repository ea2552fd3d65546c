"""Proof that a backend runs on this host: a tiny model loaded and run once, not an import.

An import proves little: TensorRT's bindings import without their libraries' GPU half,
onnxruntime-gpu lists CUDA and TensorRT providers it cannot start, torch imports without
CUDA. So a backend is chosen only after it has answered one forward pass. The verdict is
kept for the life of the process: the host does not change under it.
"""

from __future__ import annotations

import base64
import io
import logging
import tempfile
import threading
from pathlib import Path

import numpy as np

from edgefleet.shared.errors import EdgefleetError
from edgefleet.shared.executor.backends import backends, create_executor, gpu_reason
from edgefleet.shared.executor.base import ModelBlob, runtime_message
from edgefleet.shared.executor.settings import ExecutionSettings
from edgefleet.shared.hashing import sha256_bytes

log = logging.getLogger(__name__)

# Relu over float32[1, 3, 8, 8], opset 13, IR 8: what onnx.helper builds (the runtime
# needs no `onnx` package; tests/unit/test_executor_proof.py rebuilds it and compares)
TINY_ONNX = base64.b64decode(
    "CAgSCWVkZ2VmbGVldDpZCgwKAXgSAXkiBFJlbHUSD2VkZ2VmbGVldC1wcm9vZlobCgF4EhYKFAgBEhAKAggB"
    "CgIIAwoCCAgKAggIYhsKAXkSFgoUCAESEAoCCAEKAggDCgIICAoCCAhCBAoAEA0="
)
TINY_SHAPE = (1, 3, 8, 8)

_VERDICTS: dict[tuple[str, int, str], str | None] = {}
_PROVIDERS: dict[tuple[str, int, str], tuple[str, ...]] = {}
_LOCK = threading.Lock()


def prove(name: str, settings: ExecutionSettings) -> str | None:
    """None when backend `name` loaded and ran the tiny model here, else why not (cached)."""
    key = (name, settings.gpu_index, settings.precision)
    with _LOCK:  # one proof per backend even when models load on several threads
        if key not in _VERDICTS:
            _VERDICTS[key] = _attempt(name, settings, key)
            if _VERDICTS[key] is None:
                log.info("backend proven", extra={"backend": name})
        return _VERDICTS[key]


def proven() -> dict[str, str | None]:
    """Every verdict so far: backend -> None (it ran) or the reason it did not."""
    with _LOCK:
        return {name: why for (name, _, _), why in _VERDICTS.items()}


def providers(name: str, settings: ExecutionSettings) -> tuple[str, ...]:
    """The providers backend `name` really started for its proof (empty before one ran)."""
    with _LOCK:
        return _PROVIDERS.get((name, settings.gpu_index, settings.precision), ())


def _attempt(name: str, settings: ExecutionSettings, key: tuple[str, int, str]) -> str | None:
    x = np.linspace(-1.0, 1.0, int(np.prod(TINY_SHAPE)), dtype=np.float32).reshape(TINY_SHAPE)
    with tempfile.TemporaryDirectory(prefix="edgefleet-proof-") as scratch:
        # engines of the proof go to a scratch folder, never into the operator's cache
        trial = settings.model_copy(
            update={"engine_cache_dir": Path(scratch), "intra_op_threads": 1, "warmup": False}
        )
        try:
            blob = _tiny_blob(name)
            executor = create_executor(name, trial)
            try:
                executor.load(blob)
                y = executor.infer({"x": x})[0]
                _PROVIDERS[key] = executor.capabilities.providers
            finally:
                executor.close()
        except Exception as exc:  # whatever a runtime raises when its libraries are missing
            return _with_gpu_hint(name, f"{type(exc).__name__}: {_message(exc)}")
    if not np.allclose(np.asarray(y, np.float32), np.maximum(x, 0), atol=1e-2):
        return "the tiny model's output was wrong"
    return None


def _tiny_blob(name: str) -> ModelBlob:
    """The tiny model in a format the backend runs: ONNX, or TorchScript for torch."""
    if "onnx" in backends()[name].traits.formats:
        return ModelBlob("edgefleet-proof", TINY_ONNX, sha256_bytes(TINY_ONNX), "onnx")
    import torch

    buffer = io.BytesIO()
    torch.jit.save(torch.jit.trace(torch.nn.ReLU(), torch.zeros(TINY_SHAPE)), buffer)
    data = buffer.getvalue()
    return ModelBlob("edgefleet-proof", data, sha256_bytes(data), "torchscript")


def _message(exc: BaseException) -> str:
    return exc.message if isinstance(exc, EdgefleetError) else runtime_message(exc)


def _with_gpu_hint(name: str, reason: str) -> str:
    """A GPU backend's failure, with what NVML says about the GPU when it sees none."""
    hint = gpu_reason() if backends()[name].traits.gpu else None
    return f"{reason}; {hint}" if hint else reason
