"""select_backend: the winner and every loser with its reason; the lazy registry."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from edgefleet.shared.executor import backends as declared
from edgefleet.shared.executor.backends import (
    backends,
    create_executor,
    default_order,
    preference,
    probe_backends,
)
from edgefleet.shared.executor.proof import prove
from edgefleet.shared.executor.selection import NoBackendAvailable, explain, select_backend
from edgefleet.shared.executor.settings import ExecutionSettings

DEFAULT_BACKENDS = default_order()


@dataclass(frozen=True)
class Spec:
    format: str


CPU_ONLY = {
    "tensorrt": "TensorRT (tensorrt) not installed",
    "onnxruntime-tensorrt": "this onnxruntime build has no TensorrtExecutionProvider",
    "onnxruntime-cuda": "this onnxruntime build has no CUDAExecutionProvider",
    "onnxruntime-cpu": None,
    "torch-cuda": "torch not installed",
    "torch-cpu": "torch not installed",
}


def test_cpu_host_falls_back_to_onnxruntime_cpu_and_says_why():
    chosen, rejected = select_backend(CPU_ONLY, DEFAULT_BACKENDS, Spec("onnx"))
    assert chosen == "onnxruntime-cpu"
    reasons = dict(rejected)
    assert reasons["tensorrt"] == "TensorRT (tensorrt) not installed"
    assert "CUDAExecutionProvider" in reasons["onnxruntime-cuda"]
    assert reasons["torch-cpu"] == "lower preference than onnxruntime-cpu"
    assert [n for n, _ in rejected] == [n for n in DEFAULT_BACKENDS if n != chosen]
    line = explain(chosen, rejected)
    assert line.startswith("backend onnxruntime-cpu; not chosen: tensorrt (TensorRT")


def test_gpu_host_prefers_tensorrt():
    everything = dict.fromkeys(DEFAULT_BACKENDS)
    chosen, rejected = select_backend(everything, DEFAULT_BACKENDS, Spec("onnx"), "fp16")
    assert chosen == "tensorrt"
    assert all(r.startswith("lower preference") for _, r in rejected)


def test_format_and_precision_filters():
    everything = dict.fromkeys(DEFAULT_BACKENDS)
    chosen, rejected = select_backend(everything, DEFAULT_BACKENDS, Spec("torchscript"))
    assert chosen == "torch-cuda"
    assert dict(rejected)["onnxruntime-cpu"] == "does not run torchscript models"
    # int8 with TensorRT absent but ORT's TensorRT provider present: refused with the reason
    no_native = {**everything, "tensorrt": "TensorRT (tensorrt) not installed"}
    with pytest.raises(NoBackendAvailable, match="onnxruntime-tensorrt: does not support int8"):
        select_backend(no_native, DEFAULT_BACKENDS, Spec("onnx"), "int8")
    # int8 on a CPU-only host: nothing fits, and the error lists every reason
    with pytest.raises(NoBackendAvailable) as err:
        select_backend(CPU_ONLY, DEFAULT_BACKENDS, Spec("onnx"), "int8")
    assert "onnxruntime-cpu: does not support int8" in err.value.message
    assert err.value.http_status == 503


def test_unknown_and_unprobed_backends_are_explained():
    chosen, rejected = select_backend(
        {"onnxruntime-cpu": None}, ["openvino", "onnxruntime-cuda", "onnxruntime-cpu"], Spec("onnx")
    )
    assert chosen == "onnxruntime-cpu"
    assert rejected == [
        ("openvino", "unknown backend"),
        ("onnxruntime-cuda", "not probed on this host"),
    ]


def test_the_shipped_order_is_every_declared_backend_best_first_and_probe_covers_all():
    assert DEFAULT_BACKENDS == [
        "tensorrt",
        "onnxruntime-tensorrt",
        "onnxruntime-cuda",
        "onnxruntime-cpu",
        "torch-cuda",
        "torch-cpu",
    ]
    assert list(backends()) == DEFAULT_BACKENDS
    assert preference(ExecutionSettings()) == DEFAULT_BACKENDS  # none set: the shipped order
    assert preference(ExecutionSettings(backends=["torch-cpu"])) == ["torch-cpu"]
    probed = probe_backends()
    assert set(probed) == set(DEFAULT_BACKENDS)
    assert probed["onnxruntime-cpu"] is None  # onnxruntime is a core dependency


@pytest.fixture
def relu_backend(monkeypatch):
    """The test-only backend's module on the registry's list, and the caches rebuilt."""
    monkeypatch.setattr(declared, "MODULES", [*declared.MODULES, "tests.support.relu_backend"])
    backends.cache_clear()
    probe_backends.cache_clear()
    yield
    backends.cache_clear()
    probe_backends.cache_clear()


def test_a_backend_added_by_one_file_and_one_line_is_chosen_proven_and_run(relu_backend):
    assert preference(ExecutionSettings())[-1] == "numpy-relu"  # ranked last of the shipped order
    assert probe_backends()["numpy-relu"] is None
    settings = ExecutionSettings(backends=["numpy-relu", "onnxruntime-cpu"])
    chosen, rejected = select_backend(probe_backends(), preference(settings), Spec("onnx"))
    assert (chosen, rejected) == (
        "numpy-relu",
        [("onnxruntime-cpu", "lower preference than numpy-relu")],
    )
    assert prove("numpy-relu", settings) is None  # the tiny Relu of every proof ran on it
    with pytest.raises(NoBackendAvailable, match="numpy-relu: does not run torchscript models"):
        select_backend(probe_backends(), preference(settings), Spec("torchscript"))


def test_two_backends_of_one_name_are_refused(monkeypatch, relu_backend):
    monkeypatch.setattr(declared, "MODULES", [*declared.MODULES, "tests.support.relu_backend"])
    backends.cache_clear()
    with pytest.raises(RuntimeError, match="two backends share a name"):
        backends()


def test_the_backend_list_is_lazy_tensorrt_and_torch_not_imported():
    code = (
        "import sys; import edgefleet.shared.executor, edgefleet.shared.models; "
        "from edgefleet.shared.executor.backends import probe_backends; probe_backends(); "
        "print('tensorrt' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_create_executor_runs_a_tiny_onnx_graph():
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from edgefleet.shared.executor.base import ModelBlob

    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"])],
        "double",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
        initializer=[helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    data = model.SerializeToString()
    executor = create_executor("onnxruntime-cpu", ExecutionSettings(intra_op_threads=1))
    executor.load(ModelBlob("double", data, "0" * 64, "onnx"))
    (y,) = executor.infer({"x": np.ones((2, 3), np.float32)})
    assert np.array_equal(y, np.full((2, 3), 2.0, np.float32))
    caps = executor.capabilities
    assert caps.backend == "onnxruntime-cpu" and caps.device == "cpu"
    assert caps.dynamic_shapes and caps.max_batch_size is None
    assert executor.inputs[0].name == "x" and executor.inputs[0].shape == (None, 3)
    # what the runtime refuses (wrong input name, wrong shape) is one typed error
    from edgefleet.shared.executor.base import InferenceFailed

    with pytest.raises(InferenceFailed, match=r"double: .*missing from input feed"):
        executor.infer({"wrong": np.ones((2, 3), np.float32)})
    with pytest.raises(InferenceFailed) as err:
        executor.infer({"x": np.ones((2, 4), np.float32)})
    assert err.value.code == "inference_failed" and "\n" not in err.value.message
    executor.close()
    with pytest.raises(KeyError):
        create_executor("openvino", ExecutionSettings())
    del onnx


@pytest.mark.gpu
def test_cuda_provider_runs_on_a_gpu():
    from onnx import TensorProto, helper

    from edgefleet.shared.executor.base import ModelBlob

    probe_backends.cache_clear()
    assert probe_backends()["onnxruntime-cuda"] is None, probe_backends()["onnxruntime-cuda"]
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    executor = create_executor("onnxruntime-cuda", ExecutionSettings())
    executor.load(ModelBlob("relu", model.SerializeToString(), "0" * 64, "onnx"))
    x = np.array([[-1.0, 0.5, 2.0]], np.float32)
    (y,) = executor.infer({"x": x})
    assert np.array_equal(y, np.maximum(x, 0))
    assert executor.capabilities.device == "cuda:0"
    executor.close()


@pytest.mark.parametrize(
    "config,level",
    [
        (
            {"intra_op_threads": 2, "graph_optimization": "basic", "memory_arena": False},
            "ENABLE_BASIC",
        ),
        ({"inter_op_threads": 1, "graph_optimization": "disable"}, "DISABLE_ALL"),
    ],
)
def test_onnxruntime_session_options_come_from_the_settings(config, level):
    pytest.importorskip("onnx")
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from edgefleet.shared.executor.base import ModelBlob

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    settings = ExecutionSettings(**config)
    executor = create_executor("onnxruntime-cpu", settings)
    executor.load(ModelBlob("relu", model.SerializeToString(), "0" * 64, "onnx"))
    used = executor._session.get_session_options()  # what the live session was built with
    assert used.graph_optimization_level == getattr(ort.GraphOptimizationLevel, f"ORT_{level}")
    assert used.enable_cpu_mem_arena == settings.memory_arena
    assert used.intra_op_num_threads == settings.intra_op_threads
    assert used.inter_op_num_threads == settings.inter_op_threads
    executor.close()


def test_a_gpu_provider_that_did_not_start_is_a_load_error_not_a_silent_cpu_run() -> None:
    from edgefleet.shared.executor.base import ModelLoadError
    from edgefleet.shared.executor.onnxruntime_backend import check_providers

    requested = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    check_providers("onnxruntime-cuda", requested, requested)  # started as asked
    with pytest.raises(ModelLoadError, match="did not start CUDAExecutionProvider"):
        check_providers("onnxruntime-cuda", requested, ["CPUExecutionProvider"])


def test_onnx_runtime_threads_spin_unless_told_not_to() -> None:
    from edgefleet.shared.executor.onnxruntime_backend import OnnxRuntimeExecutor

    key = "session.intra_op.allow_spinning"
    default = OnnxRuntimeExecutor(ExecutionSettings())._session_options()
    quiet = OnnxRuntimeExecutor(ExecutionSettings(spinning=False))._session_options()
    with pytest.raises(RuntimeError):  # not set: ORT's default, which spins
        default.get_session_config_entry(key)
    assert quiet.get_session_config_entry(key) == "0"
    assert quiet.get_session_config_entry("session.inter_op.allow_spinning") == "0"
