"""A test-only backend: NumPy runs an ONNX graph of one Relu, and nothing else.

It shows what adding a backend takes: this one file (the executor and its `BACKENDS`
declaration) and its module's line in `edgefleet.shared.executor.backends.MODULES`.
"""

from __future__ import annotations

import numpy as np
import onnx

from edgefleet.shared.executor.base import Capabilities, ModelBlob, ModelLoadError, TensorSpec
from edgefleet.shared.executor.plugin import Backend, BackendTraits
from edgefleet.shared.executor.settings import ExecutionSettings


class ReluExecutor:
    """Runs `y = max(x, 0)` where the verified graph is exactly that."""

    name = "numpy-relu"

    def __init__(self, settings: ExecutionSettings) -> None:
        self.settings = settings
        self._inputs: list[TensorSpec] = []

    def load(self, blob: ModelBlob) -> None:
        graph = onnx.load_from_string(blob.data).graph
        if [node.op_type for node in graph.node] != ["Relu"]:
            raise ModelLoadError(f"{blob.name}: numpy-relu runs a single Relu, nothing else")
        self._inputs = [TensorSpec(i.name, (None,)) for i in graph.input]

    def infer(self, batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [np.maximum(batch[self._inputs[0].name], 0)]

    def close(self) -> None:
        self._inputs = []

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(backend=self.name, device="cpu")

    @property
    def inputs(self) -> list[TensorSpec]:
        return list(self._inputs)

    @property
    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec("y", (None,))]


BACKENDS = (
    Backend(
        "numpy-relu",
        BackendTraits(frozenset({"onnx"}), frozenset({"fp32"}), gpu=False),
        ReluExecutor,
        lambda: None,
        rank=9,
    ),
)
