"""`edgefleet cloud triton-repo OUT`: a Triton model repository for the cloud's models.

One folder per ONNX component of the served pipelines (a pipeline's detector, recogniser,
angle classifier, voters), each `config.pbtxt` + `1/model.onnx`: the file hash-checked
against the manifest before it is copied, its inputs and outputs read from the graph, the
dynamic batching and the instance groups from the options, the manifest's sha256 in a
parameter the orchestrator checks at load (`TritonExecutor`). The config is built as
Triton's own protobuf (`ModelConfig`, shipped with tritonclient), so a field Triton does not
know cannot be written. `NVIDIA's container serves it as it is: tritonserver
--model-repository OUT`.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from edgefleet.shared.config import Closed
from edgefleet.shared.errors import ConfigError
from edgefleet.shared.executor.triton_backend import SHA256_PARAMETER
from edgefleet.shared.models.registry import ModelRegistry
from edgefleet.shared.models.spec import ModelSpec

log = logging.getLogger(__name__)

PYTHON_MODEL = Path(__file__).with_name("python_model.py")
_TYPES = {"tensor(float)": "TYPE_FP32", "tensor(float16)": "TYPE_FP16",
          "tensor(double)": "TYPE_FP64", "tensor(int64)": "TYPE_INT64",
          "tensor(int32)": "TYPE_INT32", "tensor(uint8)": "TYPE_UINT8",
          "tensor(int8)": "TYPE_INT8", "tensor(bool)": "TYPE_BOOL"}  # fmt: skip


class RepositoryOptions(Closed):
    """How Triton serves the models: backend, batching, instances."""

    backend: Literal["onnxruntime", "python"] = Field(
        "onnxruntime",
        description="onnxruntime: Triton's ONNX Runtime backend (NVIDIA's container); python: "
        "Triton's Python backend running ONNX Runtime (a build without the onnxruntime "
        "backend, such as nvidia-pytriton's)",
    )
    tensorrt: bool = Field(
        False, description="ONNX Runtime's TensorRT execution provider on the GPU instances"
    )
    precision: Literal["fp32", "fp16"] = Field("fp16", description="TensorRT's precision")
    kind: Literal["gpu", "cpu"] = Field("gpu", description="where the instances run")
    instances: int = Field(1, ge=1, le=64, description="model instances per device")
    max_batch_size: int = Field(16, ge=1, le=1024, description="largest batch Triton forms")
    preferred_batch_size: list[int] = Field(
        default_factory=lambda: [4, 8], description="batch sizes the batcher aims for"
    )
    max_queue_delay_us: int = Field(
        2000, ge=0, description="the oldest request waits at most this long for a batch"
    )
    intra_op_threads: int = Field(1, ge=0, le=256, description="python backend: ORT threads")


def components(registry: ModelRegistry, names: list[str]) -> list[ModelSpec]:
    """The ONNX files the named models run: a pipeline's components, or the model itself."""
    out: dict[str, ModelSpec] = {}
    for name in names:
        spec = registry.get(name)
        for part in spec.components() or [spec.name]:
            component = registry.get(part)
            if component.format != "onnx":
                raise ConfigError(f"{part}: only ONNX files go into the Triton repository")
            out[part] = component
    return list(out.values())


def model_config(spec: ModelSpec, data: bytes, sha256: str, options: RepositoryOptions) -> Any:
    """Triton's `ModelConfig` protobuf for one ONNX file."""
    import onnxruntime as ort
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2

    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    tensors = [*session.get_inputs(), *session.get_outputs()]
    batched = all(t.shape and not isinstance(t.shape[0], int) for t in tensors)

    def tensor(t: Any) -> dict[str, Any]:
        dims = [d if isinstance(d, int) and d > 0 else -1 for d in t.shape]
        if t.type not in _TYPES:
            raise ConfigError(f"{spec.name}: tensor {t.name} of type {t.type} has no Triton type")
        return {"name": t.name, "data_type": _TYPES[t.type], "dims": dims[1:] if batched else dims}

    parameters = {SHA256_PARAMETER: sha256, "edgefleet_version": spec.version}
    config: dict[str, Any] = {
        "name": spec.name,
        "backend": options.backend,
        "max_batch_size": options.max_batch_size if batched else 0,
        "input": [tensor(t) for t in session.get_inputs()],
        "output": [tensor(t) for t in session.get_outputs()],
        "instance_group": [{"count": options.instances, "kind": f"KIND_{options.kind.upper()}"}],
        "version_policy": {"latest": {"num_versions": 1}},
    }
    if batched:
        preferred = sorted(b for b in options.preferred_batch_size if b <= options.max_batch_size)
        config["dynamic_batching"] = {
            "preferred_batch_size": preferred,
            "max_queue_delay_microseconds": options.max_queue_delay_us,
        }
    if options.backend == "python":
        parameters |= {"onnx_file": "model.onnx", "intra_op_threads": str(options.intra_op_threads)}
    elif options.tensorrt:
        accelerator = {
            "name": "tensorrt",
            "parameters": {"precision_mode": options.precision.upper()},
        }
        config["optimization"] = {
            "execution_accelerators": {"gpu_execution_accelerator": [accelerator]}
        }
    config["parameters"] = {k: {"string_value": v} for k, v in parameters.items()}
    return json_format.ParseDict(config, model_config_pb2.ModelConfig())


def write_repository(
    out: Path, registry: ModelRegistry, names: list[str], options: RepositoryOptions
) -> list[Path]:
    """Write (or rewrite) one folder per component under `out`; the config files written."""
    from google.protobuf import text_format

    if options.tensorrt and (options.backend != "onnxruntime" or options.kind != "gpu"):
        raise ConfigError("TensorRT runs in the onnxruntime backend on GPU instances only")
    written = []
    for spec in components(registry, names):
        blob = registry.read_verified(spec)  # sha256 checked before a byte is copied
        config = model_config(spec, blob.data, blob.sha256, options)
        folder = out / spec.name
        if folder.exists():
            shutil.rmtree(folder)
        (folder / "1").mkdir(parents=True)
        (folder / "1" / "model.onnx").write_bytes(blob.data)
        if options.backend == "python":
            shutil.copyfile(PYTHON_MODEL, folder / "1" / "model.py")
        path = folder / "config.pbtxt"
        path.write_text(text_format.MessageToString(config))
        written.append(path)
        log.info(
            "triton model written",
            extra={"model": spec.name, "sha256": blob.sha256, "backend": options.backend},
        )
    return written
