"""YOLO (v5 and v8 layouts) and classification on tiny ONNX graphs built here."""

from __future__ import annotations

import hashlib
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from edgefleet.shared.errors import InvalidInput
from edgefleet.shared.executor.settings import BatcherSettings, ExecutionSettings
from edgefleet.shared.models import ModelRegistry, load_model
from edgefleet.shared.models.outputs.classification import top_k
from edgefleet.shared.models.outputs.yolo import decode_yolo, detect_layout

pytest.importorskip("onnx")
from onnx import TensorProto, helper

from tests.support.onnx_graphs import constant_model, v5_output, v8_output

SETTINGS = ExecutionSettings(intra_op_threads=1, batching=BatcherSettings(max_delay_ms=1))


def registry_with(tmp_path: Path, name: str, data: bytes, **entry) -> ModelRegistry:
    (tmp_path / f"{name}.onnx").write_bytes(data)
    spec = {
        "name": name,
        "version": "1",
        "file": f"{name}.onnx",
        "sha256": hashlib.sha256(data).hexdigest(),
        **entry,
    }
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump({"models": [spec]}))
    return ModelRegistry.from_file(path)


def expected_boxes():
    # a 128x256 (h x w) image on a 64x64 canvas: scale 0.25, 16 px padding on top
    return {("a", (60.0, 40.0, 100.0, 72.0)), ("b", (64.0, 40.0, 104.0, 72.0))}


@pytest.mark.parametrize("layout,output", [("v8", v8_output()), ("v5", v5_output())])
def test_yolo_model_decodes_nms_and_maps_boxes_back(tmp_path, layout, output):
    registry = registry_with(
        tmp_path,
        f"tiny-{layout}",
        constant_model(output, [1, 3, 64, 64]),
        task="yolo",
        labels=["a", "b", "c"],
        yolo={"layout": "auto"},
    )
    with load_model(f"tiny-{layout}", settings=SETTINGS, registry=registry) as model:
        assert model.info.backend == "onnxruntime-cpu"
        image = np.zeros((128, 256, 3), np.uint8)
        dets = model.predict(image)
        got = {(d.label, d.box) for d in dets}
        assert got == expected_boxes()
        assert [round(d.score, 3) for d in dets] == [0.9, 0.7]
        assert all(d.text is None and d.polygon is None for d in dets)
        # a fixed-batch-1 model still serves batches (image by image)
        many = model.predict_many([image, np.zeros((64, 64, 3), np.uint8)])
        assert len(many) == 2 and {(d.label, d.box) for d in many[0]} == expected_boxes()
        assert {d.box for d in many[1]} == {(15.0, 26.0, 25.0, 34.0), (16.0, 26.0, 26.0, 34.0)}


def test_decode_yolo_layouts_and_thresholds():
    v8 = v8_output()[0]
    assert detect_layout(v8, 3) == "v8" and detect_layout(v5_output()[0], 3) == "v5"
    # without labels the shape decides: few rows of many anchors is v8, the reverse v5
    assert detect_layout(np.zeros((84, 8400)), None) == "v8"
    assert detect_layout(np.zeros((25200, 85)), None) == "v5"
    with pytest.raises(ValueError, match="fits neither"):
        detect_layout(v8, 7)
    dets = decode_yolo(v8, num_classes=3, conf_threshold=0.95)
    assert dets.boxes.shape == (0, 4)
    strict = decode_yolo(v8, num_classes=3, iou_threshold=0.99)  # overlap 0.82 < 0.99: keep all
    assert sorted(strict.scores.tolist()) == pytest.approx([0.7, 0.8, 0.9])
    capped = decode_yolo(v8, num_classes=3, iou_threshold=0.99, max_det=1)
    assert capped.scores.tolist() == pytest.approx([0.9])


def classifier_model() -> bytes:
    nodes = [
        helper.make_node("GlobalAveragePool", ["images"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Mul", ["f", "ten"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "colour",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["n", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 3])],
        initializer=[helper.make_tensor("ten", TensorProto.FLOAT, [], [10.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def test_classification_top_k(tmp_path):
    registry = registry_with(
        tmp_path,
        "colour",
        classifier_model(),
        task="classification",
        labels=["red", "green", "blue"],
        top_k=2,
    )
    with load_model("colour", settings=SETTINGS, registry=registry) as model:
        red = np.zeros((30, 50, 3), np.uint8)
        red[..., 0] = 255
        blue = np.zeros((30, 50, 3), np.uint8)
        blue[..., 2] = 255
        out = model.predict_many([red, blue])
        assert [d.label for d in out[0]] == ["red", "green"]
        # a camera's BGR frame and an I420 one read as the same colours
        assert model.predict(np.ascontiguousarray(red[..., ::-1]), fmt="bgr")[0].label == "red"
        i420 = cv2.cvtColor(blue, cv2.COLOR_RGB2YUV_I420)
        assert model.predict(i420, fmt="i420")[0].label == "blue"
        assert out[1][0].label == "blue"
        assert out[0][0].score == pytest.approx(np.exp(10) / (np.exp(10) + 2), rel=1e-4)
        assert out[0][0].box is None
        with pytest.raises(InvalidInput, match="uint8"):
            model.predict(red.astype(np.float32))
        with pytest.raises(InvalidInput, match=r"\(H, W, 3\)"):
            model.predict(red[..., 0])


def test_top_k_keeps_probabilities_and_checks_labels():
    probs = np.array([[0.1, 0.6, 0.3]], np.float32)
    assert top_k(probs, ["a", "b", "c"], 5) == [
        [("b", pytest.approx(0.6)), ("c", pytest.approx(0.3)), ("a", pytest.approx(0.1))]
    ]
    with pytest.raises(ValueError, match="2 labels"):
        top_k(probs, ["a", "b"], 1)


def test_yolo_pre_processing_matches_the_reference_path(tmp_path):
    from edgefleet.shared.models.frames import FrameIn
    from edgefleet.shared.models.preprocess import stack_canvases

    registry = registry_with(
        tmp_path,
        "tiny-pre",
        constant_model(v8_output(), [1, 3, 64, 64]),
        task="yolo",
        labels=["a", "b", "c"],
        mean=[0.1, 0.2, 0.3],
        std=[0.5, 0.6, 0.7],
        input={"color": "BGR"},
    )
    with load_model("tiny-pre", settings=SETTINGS, registry=registry) as model:
        image = np.random.default_rng(3).integers(0, 255, (32, 64, 3), dtype=np.uint8)
        # the same picture as RGB and as a camera's BGR frame: the same tensor
        for frame in (FrameIn.checked(image), FrameIn.checked(image[..., ::-1].copy(), "bgr")):
            prepared = model.pre_process([frame])
            reference = stack_canvases(
                [image], prepared.plans, model._fill, [0.1, 0.2, 0.3], [0.5, 0.6, 0.7], 1 / 255,
                True,
            )  # fmt: skip
            # no resize is needed (32x64 fits 64x64 at scale 1): only order, pad and normalise
            assert np.allclose(prepared.tensor, reference, atol=1e-3)
            assert prepared.plans[0].pad_top == 16


def test_a_closed_model_refuses_with_a_typed_retryable_error(tmp_path):
    import asyncio

    from edgefleet.shared.models.base import ModelClosed

    registry = registry_with(
        tmp_path,
        "tiny-closed",
        constant_model(v8_output(), [1, 3, 64, 64]),
        task="yolo",
        labels=["a", "b", "c"],
    )
    model = load_model("tiny-closed", settings=SETTINGS, registry=registry)
    image = np.zeros((64, 64, 3), np.uint8)
    assert len(model.predict(image)) == 2
    model.close()
    with pytest.raises(ModelClosed) as err:
        model.predict(image)
    assert err.value.http_status == 503
    with pytest.raises(ModelClosed):
        model.predict_many([image])
    with pytest.raises(ModelClosed):
        asyncio.run(model.predict_async(image))
    model.close()  # closing twice is harmless


def test_load_warms_up_records_load_and_warmup_times_and_logs_the_backend_choice(tmp_path, caplog):
    from prometheus_client import REGISTRY

    def count(metric: str, name: str) -> float:
        labels = {"model": name, "backend": "onnxruntime-cpu"}
        return REGISTRY.get_sample_value(f"{metric}_count", labels) or 0.0

    registry = registry_with(
        tmp_path,
        "tiny-warm",
        constant_model(v8_output(), [1, 3, 64, 64]),
        task="yolo",
        labels=["a", "b", "c"],
    )
    # given: a fresh model; when: it loads; then: by the time load_model returns it has
    # been timed loading and has run its warm-up inference, and the start log names the
    # chosen backend and why every other lost
    with (
        caplog.at_level("INFO", logger="edgefleet.shared"),
        load_model("tiny-warm", settings=SETTINGS, registry=registry),
    ):
        assert count("ef_model_load_seconds", "tiny-warm") == 1
        assert count("ef_model_warmup_seconds", "tiny-warm") == 1
        assert count("ef_infer_seconds", "tiny-warm") == 1  # the warm-up run
    choice = [r.getMessage() for r in caplog.records if r.getMessage().startswith("backend ")]
    assert choice and choice[0].startswith("backend onnxruntime-cpu; not chosen: tensorrt (")
    cold = SETTINGS.model_copy(update={"warmup": False})
    with load_model("tiny-warm", settings=cold, registry=registry):
        assert count("ef_model_warmup_seconds", "tiny-warm") == 1
        assert count("ef_infer_seconds", "tiny-warm") == 1
