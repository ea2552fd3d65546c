"""PyTorch backend: TorchScript and torch.export programs; never plain pickle.

torch is optional and imported only when this backend is chosen. Weights that arrive as
a state dict go through `load_weights`, which is `torch.load(..., weights_only=True)`:
the restricted unpickler builds tensors and containers only, so a `__reduce__` payload
in the file raises instead of running.
"""

from __future__ import annotations

import importlib.util
import io
import time

import numpy as np

from edgefleet.shared.errors import EdgefleetError, ModelIntegrityError
from edgefleet.shared.executor.base import (
    Capabilities,
    InferenceFailed,
    ModelBlob,
    ModelLoadError,
    TensorSpec,
    runtime_message,
)
from edgefleet.shared.executor.metrics import INFER_SECONDS, MODEL_LOAD_SECONDS
from edgefleet.shared.executor.plugin import Backend, BackendTraits
from edgefleet.shared.executor.settings import ExecutionSettings

_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def load_weights(data: bytes) -> dict:
    """A state dict from bytes, with `weights_only=True` (code in the pickle never runs)."""
    import pickle

    import torch

    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, AttributeError, TypeError) as exc:
        raise ModelIntegrityError(
            f"refused to load weights: {str(exc).splitlines()[0][:200]}",
            code="model_format_refused",
            hint="only plain tensors and containers are accepted (weights_only=True)",
        ) from None


class TorchExecutor:
    """Runs a TorchScript or torch.export program under `torch.inference_mode()`."""

    def __init__(self, settings: ExecutionSettings, device: str = "cpu") -> None:
        self.settings = settings
        self.device = device
        self.name = f"torch-{device}"
        self._module = None
        self._model = "?"
        self._inputs: list[TensorSpec] = []
        self._outputs: list[TensorSpec] = []

    def _torch_device(self) -> str:
        return "cpu" if self.device == "cpu" else f"cuda:{self.settings.gpu_index}"

    def load(self, blob: ModelBlob) -> None:
        import torch

        started = time.perf_counter()
        buffer = io.BytesIO(blob.data)
        try:
            if blob.format == "torchscript":
                module = torch.jit.load(buffer, map_location=self._torch_device())
                module.eval()
            elif blob.format == "torch-export":
                # an exported program is already in inference form (it has no eval())
                module = torch.export.load(buffer).module().to(self._torch_device())
            else:
                raise ModelLoadError(
                    f"{self.name} runs TorchScript or torch.export, not {blob.format}"
                )
        except ModelLoadError:
            raise
        except Exception as exc:  # torch raises many types on bad archives
            raise ModelLoadError(f"{self.name} cannot load {blob.name}: {exc}") from None
        precision = self.settings.precision
        if precision in {"fp16", "bf16"}:
            module = module.to(getattr(torch, _DTYPES[precision]))
        self._module = module
        self._model = blob.name
        MODEL_LOAD_SECONDS.labels(blob.name, self.name).observe(time.perf_counter() - started)

    def infer(self, batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        import torch

        if self._module is None:
            raise EdgefleetError(f"{self.name}: infer() before load()")
        started = time.perf_counter()
        dtype = getattr(torch, _DTYPES.get(self.settings.precision, "float32"))
        tensors = [
            torch.from_numpy(np.ascontiguousarray(arr)).to(self._torch_device(), dtype=dtype)
            for arr in batch.values()
        ]
        try:
            with torch.inference_mode():
                out = self._module(*tensors)
        except Exception as exc:  # torch's many types for a shape/dtype mismatch
            raise InferenceFailed(f"{self._model}: {runtime_message(exc)}") from None
        outs = out if isinstance(out, (tuple, list)) else [out]
        result = [o.detach().float().cpu().numpy() for o in outs]
        INFER_SECONDS.labels(self._model, self.name).observe(time.perf_counter() - started)
        if not self._inputs:
            self._inputs = [
                TensorSpec(name, tuple(arr.shape), "float32") for name, arr in batch.items()
            ]
            self._outputs = [
                TensorSpec(f"output{i}", tuple(r.shape), "float32") for i, r in enumerate(result)
            ]
        return result

    def close(self) -> None:
        self._module = None

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            backend=self.name,
            device=self._torch_device(),
            dtypes=("float32", "float16", "bfloat16"),
            dynamic_shapes=True,
            precision=self.settings.precision if self.settings.precision != "int8" else "fp32",
        )

    @property
    def inputs(self) -> list[TensorSpec]:
        """Known after the first inference (TorchScript does not declare input names)."""
        return list(self._inputs) or [TensorSpec("input", (None, 3, None, None))]

    @property
    def outputs(self) -> list[TensorSpec]:
        return list(self._outputs)


def _probe() -> str | None:
    return None if importlib.util.find_spec("torch") is not None else "torch not installed"


BACKENDS = (
    Backend(
        "torch-cuda",
        BackendTraits(
            frozenset({"torchscript", "torch-export"}), frozenset({"fp32", "fp16", "bf16"}), True
        ),
        lambda settings: TorchExecutor(settings, device="cuda"),
        _probe,
        rank=4,
    ),
    Backend(
        "torch-cpu",
        BackendTraits(
            frozenset({"torchscript", "torch-export"}), frozenset({"fp32", "bf16"}), False
        ),
        lambda settings: TorchExecutor(settings, device="cpu"),
        _probe,
        rank=5,
    ),
)
