"""PyTorch backend: TorchScript and torch.export programs from the manifest, CPU."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import pytest
import yaml

from edgefleet.shared.executor.settings import BatcherSettings, ExecutionSettings
from edgefleet.shared.models import ModelRegistry, load_model

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


class Colour(torch.nn.Module):
    """Logits = 10 x mean of each channel: a red image is 'red'."""

    def forward(self, x):
        return x.mean(dim=(2, 3)) * 10.0


def registry_for(tmp_path: Path, name: str, data: bytes) -> ModelRegistry:
    (tmp_path / name).write_bytes(data)
    entry = {
        "name": "colour",
        "version": "1",
        "task": "classification",
        "file": name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "input": {"height": 8, "width": 8},
        "labels": ["red", "green", "blue"],
        "top_k": 1,
    }
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump({"models": [entry]}))
    return ModelRegistry.from_file(path)


def torchscript_bytes() -> bytes:
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(Colour()), buffer)
    return buffer.getvalue()


def export_bytes() -> bytes:
    program = torch.export.export(Colour(), (torch.zeros(1, 3, 8, 8),))
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "file,make", [("colour.ts", torchscript_bytes), ("colour.pt2", export_bytes)]
)
def test_torch_programs_run_on_cpu(tmp_path, file, make):
    registry = registry_for(tmp_path, file, make())
    settings = ExecutionSettings(
        backends=["onnxruntime-cpu", "torch-cpu"], batching=BatcherSettings(enabled=False)
    )
    # the ONNX backend is preferred but cannot run a torch program: torch-cpu is chosen
    with load_model("colour", settings=settings, registry=registry) as model:
        assert model.info.backend == "torch-cpu"
        red = np.zeros((20, 30, 3), np.uint8)
        red[..., 0] = 255
        blue = np.zeros((20, 30, 3), np.uint8)
        blue[..., 2] = 255
        out = (
            model.predict_many([red, blue])
            if file.endswith(".ts")
            else [model.predict(red), model.predict(blue)]
        )
        assert [r[0].label for r in out] == ["red", "blue"]
        assert out[0][0].score > 0.99


def test_torch_pickle_checkpoint_is_refused_by_the_loader(tmp_path):
    # a plain torch.save checkpoint (.pt) is pickle-based: never loaded as a model
    buffer = io.BytesIO()
    torch.save(Colour(), buffer)
    registry = registry_for(tmp_path, "colour.pt", buffer.getvalue())
    from edgefleet.shared.errors import ModelIntegrityError

    with pytest.raises(ModelIntegrityError) as err:
        load_model("colour", registry=registry)
    assert err.value.code == "model_format_refused"


@pytest.mark.gpu
def test_torchscript_on_cuda_in_fp16(tmp_path):
    registry = registry_for(tmp_path, "colour.ts", torchscript_bytes())
    settings = ExecutionSettings(
        backends=["torch-cuda"], precision="fp16", batching=BatcherSettings(enabled=False)
    )
    with load_model("colour", settings=settings, registry=registry) as model:
        assert model.info.backend == "torch-cuda" and model.info.precision == "fp16"
        green = np.zeros((20, 30, 3), np.uint8)
        green[..., 1] = 255
        assert model.predict(green)[0].label == "green"


def test_a_tensor_the_program_refuses_is_a_typed_error():
    from edgefleet.shared.executor.backends import create_executor
    from edgefleet.shared.executor.base import InferenceFailed, ModelBlob

    executor = create_executor("torch-cpu", ExecutionSettings())
    executor.load(ModelBlob("colour", torchscript_bytes(), "0" * 64, "torchscript"))
    assert executor.infer({"x": np.ones((1, 3, 8, 8), np.float32)})[0].shape == (1, 3)
    # a 2-D tensor has no dims (2, 3) to average: torch's error becomes InferenceFailed
    with pytest.raises(InferenceFailed, match="colour: "):
        executor.infer({"x": np.ones((3, 8), np.float32)})
    executor.close()
