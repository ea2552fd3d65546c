"""Triton Python-backend model: the ONNX file beside it, run by ONNX Runtime.

`edgefleet cloud triton-repo --backend python` copies this file as `<model>/1/model.py`,
for a Triton built without the onnxruntime backend (the CPU build that nvidia-pytriton
bundles). It runs inside Triton's Python stub, never in the orchestrator: it imports
nothing of edgefleet, only what the stub's interpreter has: numpy and onnxruntime (the
stub's Python finds its packages through the `python3` first on tritonserver's PATH, so a
virtual environment's bin folder there lends it that environment's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]


class TritonPythonModel:
    """One ONNX Runtime session per model instance; each request runs as it came."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        folder = Path(args["model_repository"]) / args["model_version"]
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(params.get("intra_op_threads", "1"))
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(
            str(folder / params.get("onnx_file", "model.onnx")),
            sess_options=options,
            providers=["CPUExecutionProvider"],
        )
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [o["name"] for o in config["output"]]

    def execute(self, requests: list[Any]) -> list[Any]:
        # tensors in and out through DLPack: the stub's numpy path (`as_numpy()`,
        # `pb_utils.Tensor(name, array)`) reads inputs wrong and sends empty outputs under
        # numpy 2 (nvidia-pytriton's stub, Triton 2.51)
        responses = []
        for request in requests:
            feed = {
                name: np.from_dlpack(pb_utils.get_input_tensor_by_name(request, name))
                for name in self.inputs
            }
            try:
                got = self.session.run(self.outputs, feed)
            except Exception as exc:  # ORT's own error types: the client gets the message
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)[:300]))
                )
                continue
            tensors = [
                pb_utils.Tensor.from_dlpack(name, np.ascontiguousarray(value))
                for name, value in zip(self.outputs, got, strict=True)
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
