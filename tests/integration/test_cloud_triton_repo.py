"""`edgefleet cloud triton-repo OUT`: every config.pbtxt parses as Triton's own model
configuration (the `ModelConfig` protobuf tritonclient ships, unknown fields refused), names
the manifest's sha256 of the ONNX file beside it, and the repository of the cloud's default
models is loaded by a real tritonserver where its backend is there (nvidia-pytriton's build
has the Python backend only: the onnxruntime flavour is refused for that reason, named, and
the python flavour of the same models loads)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2
from typer.testing import CliRunner

from edgefleet.bench.triton_server import TritonServer, pytriton_root
from edgefleet.cli import app
from edgefleet.shared.models import ModelRegistry

COMPONENTS = {"ppocr6-small-det", "ppocr6-small-rec", "ppocr6-tiny-det", "ppocr6-tiny-rec"}


def _write(out: Path, *options: str) -> list[str]:
    done = CliRunner().invoke(app, ["cloud", "triton-repo", str(out), *options])
    assert done.exit_code == 0, done.output
    return done.stdout.split()


def _configs(out: Path) -> dict[str, model_config_pb2.ModelConfig]:
    """Each model's config, parsed by Triton's schema (an unknown field raises)."""
    return {
        path.parent.name: text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
        for path in sorted(out.glob("*/config.pbtxt"))
    }


def test_the_repository_validates_against_tritons_model_config(tmp_path: Path) -> None:
    # when the repository of the default served models is written
    assert set(_write(tmp_path / "repo", "--instances", "2")) == COMPONENTS
    configs = _configs(tmp_path / "repo")
    registry = ModelRegistry.default()
    # then each is Triton's ONNX Runtime backend over the manifest's own file
    assert set(configs) == COMPONENTS
    for name, config in configs.items():
        spec = registry.get(name)
        onnx = tmp_path / "repo" / name / "1" / "model.onnx"
        assert hashlib.sha256(onnx.read_bytes()).hexdigest() == spec.sha256
        assert config.name == name and config.backend == "onnxruntime"
        assert config.parameters["edgefleet_sha256"].string_value == spec.sha256
        assert config.max_batch_size == 16
        assert [i.name for i in config.input] == ["x"]
        assert config.input[0].data_type == model_config_pb2.TYPE_FP32
        assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]
        assert [(g.count, g.kind) for g in config.instance_group] == [
            (2, model_config_pb2.ModelInstanceGroup.KIND_GPU)
        ]
        assert not config.optimization.execution_accelerators.gpu_execution_accelerator
    # the recogniser's fixed height is kept, the batch axis is Triton's own
    assert list(configs["ppocr6-small-rec"].input[0].dims) == [3, 48, -1]
    assert list(configs["ppocr6-small-det"].input[0].dims) == [3, -1, -1]
    assert list(configs["ppocr6-small-det"].output[0].dims) == [1, -1, -1]


def test_tensorrt_where_asked(tmp_path: Path) -> None:
    _write(tmp_path / "repo", "--tensorrt", "--model", "ppocr6-cloud")
    configs = _configs(tmp_path / "repo")
    assert set(configs) == {"ppocr6-small-det", "ppocr6-small-rec"}
    for config in configs.values():
        (trt,) = config.optimization.execution_accelerators.gpu_execution_accelerator
        assert trt.name == "tensorrt" and trt.parameters["precision_mode"] == "FP16"
    # and never where it cannot run
    done = CliRunner().invoke(
        app, ["cloud", "triton-repo", str(tmp_path / "x"), "--tensorrt", "--kind", "cpu"]
    )
    assert done.exit_code == 2 and "TensorRT runs in the onnxruntime backend" in done.output


def test_a_file_that_is_not_the_manifests_is_refused(tmp_path: Path) -> None:
    registry = ModelRegistry.default()
    det = registry.get("ppocr6-tiny-det")
    tampered = tmp_path / "det.onnx"
    shutil.copyfile(registry.resolve(det), tampered)
    with tampered.open("ab") as f:
        f.write(b"\0")
    entry = det.model_dump(mode="json", exclude={"base_dir"}, exclude_none=True)
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(yaml.safe_dump({"models": [entry | {"file": str(tampered)}]}))
    config = tmp_path / "cloud.yaml"
    config.write_text(yaml.safe_dump({"models": {"manifest": str(manifest)}}))
    done = CliRunner().invoke(
        app, ["cloud", "triton-repo", str(tmp_path / "repo"), "-c", str(config), "-m", det.name]
    )
    assert done.exit_code == 2 and "refused before parsing" in done.output
    assert not (tmp_path / "repo" / det.name).exists()


@pytest.mark.slow
def test_the_default_repository_loads_where_the_servers_backend_allows(tmp_path: Path) -> None:
    bundled = {p.name for p in (pytriton_root() / "tritonserver" / "backends").iterdir()}
    # given the default cloud models' repository, for the CPU
    _write(tmp_path / "ort", "--kind", "cpu")
    server = TritonServer(tmp_path / "ort", tmp_path / "ort-server").start(wait_ready=False)
    try:
        states = {name: server.model_state(name) for name in COMPONENTS}
    finally:
        server.kill()
    if "onnxruntime" in bundled:
        assert all(ready for ready, _ in states.values()), states
    else:  # nvidia-pytriton's server: refused for the backend, not for the config
        assert not any(ready for ready, _ in states.values()), states
        assert all("backend library for backend 'onnxruntime'" in why for _, why in states.values())
    # and the python flavour of the same models loads and serves on this server
    _write(tmp_path / "py", "--kind", "cpu", "--backend", "python")
    with TritonServer(tmp_path / "py", tmp_path / "py-server") as server:
        assert all(server.model_state(name)[0] for name in COMPONENTS)
