"""The triton backend against a real tritonserver (nvidia-pytriton's, Python backend running
ONNX Runtime): the same outputs as the in-process session over gRPC and HTTP, batches
larger than the server's split, the batch's deadline carried by the call, a served model
that is not the manifest's refused, and a server that is down named at load."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from edgefleet.bench.mosquitto import free_port
from edgefleet.bench.triton_server import TritonServer
from edgefleet.cloud.triton.repository import RepositoryOptions, write_repository
from edgefleet.shared.errors import InferenceTimeout
from edgefleet.shared.executor.base import ModelBlob, ModelLoadError
from edgefleet.shared.executor.deadline import batch_deadline
from edgefleet.shared.executor.onnxruntime_backend import OnnxRuntimeExecutor
from edgefleet.shared.executor.settings import ExecutionSettings, TritonServing
from edgefleet.shared.executor.triton_backend import TritonExecutor, TritonUnavailable
from edgefleet.shared.models import ModelRegistry

REC = "ppocr6-tiny-rec"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    work = tmp_path_factory.mktemp("triton-backend")
    options = RepositoryOptions(backend="python", kind="cpu", max_batch_size=4)
    write_repository(work / "repo", ModelRegistry.default(), ["ppocr6-tiny"], options)
    with TritonServer(work / "repo", work) as running:
        yield running


def _blob(name: str = REC) -> ModelBlob:
    registry = ModelRegistry.default()
    return registry.read_verified(registry.get(name))


def _on(server: TritonServer, protocol: str, blob: ModelBlob) -> TritonExecutor:
    url = server.grpc_url if protocol == "grpc" else server.http_url
    executor = TritonExecutor(ExecutionSettings(), TritonServing(url=url, protocol=protocol))
    executor.load(blob)
    return executor


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_same_outputs_as_in_process_and_batches_split_to_the_servers(
    server: TritonServer, protocol: str
) -> None:
    blob = _blob()
    local = OnnxRuntimeExecutor(ExecutionSettings(intra_op_threads=1))
    local.load(blob)
    remote = _on(server, protocol, blob)
    try:
        # a batch of 6 on a server that takes 4 at most: sent as 4 + 2
        x = np.random.default_rng(1).random((6, 3, 48, 160), dtype=np.float32)
        assert remote.capabilities.max_batch_size == 4
        (got,), (want,) = remote.infer({"x": x}), local.infer({"x": x})
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        assert [t.name for t in remote.inputs] == ["x"]
        assert remote.inputs[0].shape == (None, 3, 48, None)
    finally:
        remote.close()
        local.close()


def test_the_call_carries_the_batchs_deadline(server: TritonServer) -> None:
    remote = _on(server, "grpc", _blob())
    x = np.zeros((4, 3, 48, 1600), np.float32)
    try:
        with batch_deadline(time.monotonic() + 0.001), pytest.raises(InferenceTimeout):
            remote.infer({"x": x})
        with batch_deadline(time.monotonic() - 1), pytest.raises(InferenceTimeout):
            remote.infer({"x": x})  # nothing left: not even sent
        with batch_deadline(time.monotonic() + 60):
            assert remote.infer({"x": x})[0].shape[0] == 4
    finally:
        remote.close()


def test_a_served_model_that_is_not_the_manifests_is_refused(server: TritonServer) -> None:
    blob = _blob()
    other = ModelBlob(blob.name, blob.data, "0" * 64, blob.format)
    executor = TritonExecutor(ExecutionSettings(), TritonServing(url=server.grpc_url))
    with pytest.raises(ModelLoadError, match="manifest pins"):
        executor.load(other)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_server_that_is_down_is_named_at_load(protocol: str) -> None:
    url = f"127.0.0.1:{free_port()}"  # nothing listens there
    executor = TritonExecutor(
        ExecutionSettings(), TritonServing(url=url, protocol=protocol, connect_timeout_s=1)
    )
    with pytest.raises(TritonUnavailable, match=url):
        executor.load(_blob())
    assert executor.probe()["reason"]


def test_a_model_the_server_does_not_have(server: TritonServer) -> None:
    serving = TritonServing(url=server.grpc_url, model="no-such-model")
    with pytest.raises(TritonUnavailable, match="no-such-model"):
        TritonExecutor(ExecutionSettings(), serving).load(_blob())
