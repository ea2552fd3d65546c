"""TensorRT logic that needs no GPU: profiles, engine cache keys, calibration batches."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from edgefleet.shared.errors import ConfigError
from edgefleet.shared.executor.base import TensorSpec
from edgefleet.shared.executor.settings import ExecutionSettings
from edgefleet.shared.executor.tensorrt_plan import (
    EngineKey,
    ProfileShape,
    calibration_batches,
    calibration_digest,
    image_files,
    letterbox_loader,
    plan_profile,
)


def test_profile_for_dynamic_batch_and_size():
    det = TensorSpec("x", (None, 3, None, None))
    (p,) = plan_profile(
        [det], max_batch=8, opt_batch=4, min_hw=(32, 32), opt_hw=(640, 640), max_hw=(960, 960)
    )
    assert p == ProfileShape("x", (1, 3, 32, 32), (4, 3, 640, 640), (8, 3, 960, 960))


def test_profile_keeps_fixed_dims_and_defaults_opt_to_max():
    yolo = TensorSpec("images", (None, 3, 640, 640))
    (p,) = plan_profile([yolo], max_batch=4)
    assert (p.min, p.opt, p.max) == ((1, 3, 640, 640), (4, 3, 640, 640), (4, 3, 640, 640))
    (fixed,) = plan_profile([TensorSpec("images", (1, 3, 640, 640))], max_batch=4)
    assert fixed.min == fixed.opt == fixed.max == (1, 3, 640, 640)


def test_profile_refuses_what_it_cannot_plan():
    with pytest.raises(ConfigError):
        plan_profile([TensorSpec("x", (None, 3, 64, 64))], max_batch=0)
    with pytest.raises(ConfigError, match="min_hw <= opt_hw <= max_hw"):
        plan_profile(
            [TensorSpec("x", (None, 3, None, None))],
            max_batch=2,
            min_hw=(64, 64),
            opt_hw=(32, 32),
            max_hw=(128, 128),
        )
    with pytest.raises(ConfigError, match="dynamic axis 1"):
        plan_profile([TensorSpec("tokens", (None, None))], max_batch=2)


def _key(**changes) -> EngineKey:
    base = dict(
        onnx_sha256="ab" * 32,
        trt_version="10.3.0",
        gpu_name="Orin (nvgpu)",
        compute_capability="8.7",
        precision="fp16",
        profile=(ProfileShape("x", (1, 3, 32, 32), (4, 3, 640, 640), (8, 3, 960, 960)),),
    )
    base.update(changes)
    return EngineKey(**base)


def test_engine_key_is_stable_and_sensitive_to_every_field():
    key = _key()
    assert key.digest() == _key().digest()
    assert len(key.digest()) == 64
    variants = [
        _key(onnx_sha256="cd" * 32),
        _key(trt_version="10.4.0"),
        _key(gpu_name="NVIDIA H200"),
        _key(compute_capability="9.0"),
        _key(precision="int8"),
        _key(profile=(ProfileShape("x", (1, 3, 32, 32), (8, 3, 640, 640), (8, 3, 960, 960)),)),
        _key(calibration_sha256="ef" * 32),
    ]
    digests = {v.digest() for v in variants}
    assert key.digest() not in digests and len(digests) == len(variants)


def test_engine_cache_file_names():
    key = _key()
    assert key.filename("ppocr-det") == f"ppocr-det-fp16-{key.digest()[:16]}.engine"
    assert key.filename("../evil name").startswith("evil_name-fp16-")
    assert "/" not in key.filename("a/b")
    assert key.timing_cache_name() == "timing-orin_nvgpu-sm8.7-trt10.3.0.cache"
    # calibration depends on the model and data only: same across GPUs and precisions
    other_gpu = _key(gpu_name="NVIDIA H200", compute_capability="9.0", precision="int8")
    assert key.calibration_cache_name("m") == other_gpu.calibration_cache_name("m")
    other_images = _key(calibration_sha256="ef" * 32)
    assert key.calibration_cache_name("m") != other_images.calibration_cache_name("m")


def test_calibration_digest_follows_the_images(tmp_path: Path):
    _write_images(tmp_path, 3)
    files = image_files(tmp_path)
    digest = calibration_digest(files)
    assert digest == calibration_digest(image_files(tmp_path))
    assert digest != calibration_digest(files[:2])
    cv2.imwrite(str(files[0]), np.full((8, 8, 3), 255, np.uint8))
    assert digest != calibration_digest(files)


def _write_images(folder: Path, count: int) -> None:
    for i in range(count):
        img = np.full((40 + i, 60, 3), 20 * i, np.uint8)
        cv2.imwrite(str(folder / f"img{i:02d}.png"), img)


def test_calibration_batches_are_full_ordered_and_skip_bad_images(tmp_path: Path):
    _write_images(tmp_path, 5)
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8\xff not really a jpeg")
    (tmp_path / "notes.txt").write_text("ignored")
    files = image_files(tmp_path)
    assert [f.name for f in files] == ["broken.jpg"] + [f"img{i:02d}.png" for i in range(5)]
    loader = letterbox_loader((32, 32), [0.0, 0.0, 0.0], [1.0, 1.0, 1.0])
    batches = list(calibration_batches(files, 2, loader))
    # 5 good images in batches of 2: the last batch is topped up by repeating the first
    assert [b.shape for b in batches] == [(2, 3, 32, 32)] * 3
    assert all(b.dtype == np.float32 and b.flags.c_contiguous for b in batches)
    assert np.array_equal(batches[2][1], batches[0][0])
    # image i is grey level 20*i: the batches keep file order
    centre = [float(b[k, 0, 16, 16]) for b in batches for k in range(2)]
    assert centre[:5] == pytest.approx([20 * i / 255 for i in range(5)], abs=1e-3)


def test_calibration_needs_images(tmp_path: Path):
    with pytest.raises(ConfigError, match="holds no images"):
        image_files(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        image_files(tmp_path / "missing")
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n broken")
    loader = letterbox_loader((32, 32), [0.0] * 3, [1.0] * 3)
    with pytest.raises(ConfigError, match="no calibration image"):
        list(calibration_batches([bad], 2, loader))


@pytest.mark.trt
@pytest.mark.gpu
def test_build_engine_caches_and_runs(tmp_path: Path):
    import onnx
    from onnx import TensorProto, helper

    from edgefleet.shared.executor.base import ModelBlob
    from edgefleet.shared.executor.tensorrt_backend import TensorRTExecutor, build_or_load_engine
    from edgefleet.shared.models.registry import sha256_bytes

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3, 32, 32])],
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    data.ir_version = 8
    raw = data.SerializeToString()
    blob = ModelBlob("relu", raw, sha256_bytes(raw), "onnx")
    settings = ExecutionSettings(precision="fp16", engine_cache_dir=tmp_path)
    first = build_or_load_engine(blob, settings, max_batch=4)
    again = build_or_load_engine(blob, settings, max_batch=4)
    assert not first.cached and again.cached and first.path == again.path
    executor = TensorRTExecutor(settings)
    executor.load(blob)
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    (y,) = executor.infer({"x": x})
    assert np.allclose(y, np.maximum(x, 0), atol=1e-2)
    executor.close()
    del onnx


def test_calibration_tensors_follow_the_model_channel_order(tmp_path: Path):
    red = np.zeros((32, 32, 3), np.uint8)
    red[..., 2] = 255  # OpenCV writes BGR: this is a red image
    cv2.imwrite(str(tmp_path / "red.png"), red)
    rgb = letterbox_loader((32, 32), [0.0] * 3, [1.0] * 3)(tmp_path / "red.png")
    bgr = letterbox_loader((32, 32), [0.0] * 3, [1.0] * 3, bgr=True)(tmp_path / "red.png")
    assert rgb[0].mean() == pytest.approx(1.0) and rgb[2].mean() == pytest.approx(0.0)
    assert bgr[2].mean() == pytest.approx(1.0) and bgr[0].mean() == pytest.approx(0.0)


def test_engine_cache_default_follows_home_when_settings_are_made(tmp_path, monkeypatch):
    # the default is read when the settings are built, not when the module was imported
    monkeypatch.setenv("HOME", str(tmp_path))
    expected = tmp_path / ".cache" / "edgefleet" / "engines"
    assert ExecutionSettings().engine_cache_dir == expected
