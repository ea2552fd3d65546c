"""A backend is chosen only once it has loaded and run a tiny model here; down the order a
backend that is missing, fails its proof or fails to load the model is passed over (logged,
counted) for the next, on the real runtimes of this host."""

from __future__ import annotations

import importlib.util
import io
import logging

import numpy as np
import pytest

from edgefleet.shared.executor.backends import create_executor, gpu_reason
from edgefleet.shared.executor.base import ModelBlob, ModelLoadError
from edgefleet.shared.executor.fallback import open_first, report
from edgefleet.shared.executor.proof import TINY_ONNX, TINY_SHAPE, prove, proven
from edgefleet.shared.executor.selection import NoBackendAvailable, Screened
from edgefleet.shared.executor.settings import ExecutionSettings
from tests.support.waiting import counter_value

SETTINGS = ExecutionSettings(intra_op_threads=1)


def test_the_tiny_model_is_what_the_onnx_helper_builds() -> None:
    from onnx import TensorProto, checker, helper, load_from_string

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "edgefleet-proof",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(TINY_SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(TINY_SHAPE))],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="edgefleet"
    )
    model.ir_version = 8
    assert model.SerializeToString() == TINY_ONNX
    checker.check_model(load_from_string(TINY_ONNX))
    assert len(TINY_ONNX) < 4096


def test_onnxruntime_cpu_is_proven_once_per_process() -> None:
    from prometheus_client import REGISTRY

    def proof_loads() -> float:
        labels = {"model": "edgefleet-proof", "backend": "onnxruntime-cpu"}
        return REGISTRY.get_sample_value("ef_model_load_seconds_count", labels) or 0.0

    assert prove("onnxruntime-cpu", SETTINGS) is None
    loads = proof_loads()
    assert loads >= 1
    assert prove("onnxruntime-cpu", SETTINGS) is None
    assert proof_loads() == loads  # the verdict was kept, not proven again
    assert proven()["onnxruntime-cpu"] is None


def test_the_tensorrt_backend_without_tensorrt_fails_its_proof_with_the_reason() -> None:
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("TensorRT is installed here")
    # the real TensorRT backend module, on a host without TensorRT
    why = prove("tensorrt", SETTINGS)
    assert why is not None and "No module named 'tensorrt'" in why
    if gpu_reason() is not None:
        assert why.endswith(gpu_reason() or "")  # and what NVML says about the GPU


def test_torch_cuda_on_a_cpu_build_of_torch_fails_its_proof() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    why = prove("torch-cuda", SETTINGS)
    assert why is not None and "CUDA" in why
    assert prove("torch-cpu", SETTINGS) is None


def test_nothing_proven_is_a_typed_503_with_every_reason() -> None:
    with pytest.raises(NoBackendAvailable) as err:
        open_first(
            [
                Screened("onnxruntime-tensorrt", "this onnxruntime build has no X", host=True),
                Screened("tensorrt", None),
            ],
            SETTINGS,
            lambda name: pytest.fail(f"{name} was opened without a proof"),
            model="m",
            fmt="onnx",
        )
    assert err.value.http_status == 503
    assert "onnxruntime-tensorrt: this onnxruntime build has no X" in err.value.message
    assert "tensorrt: failed its proof" in err.value.message


def _torchscript_relu() -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.jit.save(torch.jit.trace(torch.nn.ReLU(), torch.zeros(1, 3)), buffer)
    return buffer.getvalue()


def test_a_model_that_does_not_load_on_a_proven_backend_falls_to_the_next(caplog) -> None:
    pytest.importorskip("torch")
    # given an ONNX Runtime that cannot parse the file it is handed, and torch that can
    blobs = {
        "onnxruntime-cpu": ModelBlob("m", b"not an onnx graph", "0" * 64, "onnx"),
        "torch-cpu": ModelBlob("m", _torchscript_relu(), "0" * 64, "torchscript"),
    }

    def open_on(name: str):
        executor = create_executor(name, SETTINGS)
        executor.load(blobs[name])
        return executor

    before = counter_value("ef_backend_fallbacks_total", backend="onnxruntime-cpu", reason="load")
    # when the walk opens it
    with caplog.at_level(logging.WARNING, "edgefleet.shared.executor.fallback"):
        chosen, executor, skipped = open_first(
            [Screened("onnxruntime-cpu", None), Screened("torch-cpu", None)],
            SETTINGS,
            open_on,
            model="m",
            fmt="onnx",
        )
    # then it runs on the next backend, and the one passed over says why
    assert chosen == "torch-cpu"
    (y,) = executor.infer({"x": np.array([[-1.0, 0.0, 2.0]], np.float32)})
    assert np.array_equal(y, [[0.0, 0.0, 2.0]])
    assert [name for name, _ in skipped] == ["onnxruntime-cpu"]
    assert skipped[0][1].startswith("did not load the model: onnxruntime-cpu cannot load m")
    after = counter_value("ef_backend_fallbacks_total", backend="onnxruntime-cpu", reason="load")
    assert after == before + 1
    (record,) = [r for r in caplog.records if "passed over" in r.getMessage()]
    assert record.backend == "onnxruntime-cpu" and record.reason == "load"  # type: ignore[attr-defined]


def test_a_model_no_proven_backend_loads_raises_its_load_error() -> None:
    def open_on(name: str):
        executor = create_executor(name, SETTINGS)
        executor.load(ModelBlob("broken", b"not an onnx graph", "0" * 64, "onnx"))
        return executor

    with pytest.raises(ModelLoadError, match="cannot load broken"):
        open_first([Screened("onnxruntime-cpu", None)], SETTINGS, open_on, model="b", fmt="onnx")


def test_an_opened_model_is_in_the_report(tmp_path) -> None:
    from edgefleet.shared.models import load_model
    from tests.support.onnx_graphs import constant_model
    from tests.unit.test_models_vision import registry_with

    registry = registry_with(
        tmp_path,
        "tiny-cls",
        constant_model(np.array([[0.1, 0.9]], np.float32), [1, 3, 8, 8]),
        task="classification",
        labels=["a", "b"],
    )
    with load_model("tiny-cls", settings=SETTINGS, registry=registry):
        choice = report()["models"]["tiny-cls"]
    assert choice["backend"] == "onnxruntime-cpu"
    assert choice["provider"] == "CPUExecutionProvider"
    assert all(s["reason"] for s in choice["skipped"])
