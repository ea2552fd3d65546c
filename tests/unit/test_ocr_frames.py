"""Camera frames reach the OCR model's tensor in their own format, through the kernels.

The reference backend (OpenCV + numpy) defines correct; the native kernels must give the
same detector tensor, and no stage may convert or copy the whole frame on the way.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from edgefleet.shared import kernels
from edgefleet.shared.errors import InvalidInput
from edgefleet.shared.executor.settings import BatcherSettings, ExecutionSettings
from edgefleet.shared.models import load_model
from edgefleet.shared.models.frames import FrameIn
from tests.support.frames import as_format


@pytest.fixture(scope="module")
def ocr():
    settings = ExecutionSettings(
        backends=["onnxruntime-cpu"], intra_op_threads=1, batching=BatcherSettings(enabled=False)
    )
    with load_model("ppocr6-tiny", settings=settings) as model:
        yield model


def camera_scene(h: int = 540, w: int = 960) -> np.ndarray:
    """An RGB still with two lines of text on a tinted background (even sizes: 4:2:0)."""
    img = np.full((h, w, 3), (200, 215, 190), np.uint8)
    cv2.putText(img, "GATE 12", (40, h // 3), cv2.FONT_HERSHEY_DUPLEX, 2.0, (20, 30, 90), 3)
    cv2.putText(img, "MSCU1234565", (300, 2 * h // 3), cv2.FONT_HERSHEY_DUPLEX, 1.6, (10,) * 3, 3)
    return img


FORMATS = ["rgb", "bgr", "nv12", "i420"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_pixel_format_reads_the_same_lines(ocr, fmt):
    # given one scene delivered in each camera format
    rgb = camera_scene()
    # when the model reads each as it is
    lines = ocr.predict(as_format(rgb, fmt), fmt=fmt)
    # then the text is the same, boxes in the frame's pixels
    assert [d.text for d in lines] == ["GATE 12", "MSCU1234565"]
    assert lines[0].box is not None and lines[0].box[0] == pytest.approx(40, abs=12)


@pytest.mark.parametrize("fmt", FORMATS)
def test_detector_tensor_from_the_kernel_matches_the_reference_path(ocr, fmt):
    frame = FrameIn.checked(as_format(camera_scene(), fmt), fmt)
    assert kernels.backend() in ("c", "neon")
    native = ocr.pre_process([frame])
    try:
        kernels.use_backend("reference")
        reference = ocr.pre_process([frame])
    finally:
        kernels.use_backend(None)
    # the detector's input stretched to /32 (no pad): 960x540 -> 640x352
    assert native.tensor.shape == reference.tensor.shape == (1, 3, 352, 640)
    # within 1/255 of the pixel scale, over the smallest std (0.224)
    assert np.abs(native.tensor - reference.tensor).max() <= (1 / 255) / 0.224 + 1e-6


@pytest.mark.parametrize("fmt", ["bgr", "nv12"])
def test_no_full_frame_conversion_or_copy_between_capture_and_tensor(ocr, fmt, monkeypatch):
    # given a 1080p camera frame and spies on every way a frame could be converted
    frame = as_format(camera_scene(1080, 1920), fmt)
    converted: list[tuple[int, ...]] = []  # every cv2.cvtColor
    regions: list[tuple[int, ...]] = []  # every kernels.to_rgb
    handed: list[np.ndarray] = []
    lines_from: list[np.ndarray] = []  # the frame each line-reading kernel call sampled
    real_cvt, real_to_rgb, real_to_tensor = cv2.cvtColor, kernels.to_rgb, kernels.frame_to_tensor
    real_quads = kernels.quads_to_tensor

    def cvt(src, code, *args, **kwargs):
        converted.append(src.shape)
        return real_cvt(src, code, *args, **kwargs)

    def to_rgb(pixels, f):
        regions.append(pixels.shape)
        return real_to_rgb(pixels, f)

    def to_tensor(pixels, f, *args, **kwargs):
        handed.append(pixels)
        return real_to_tensor(pixels, f, *args, **kwargs)

    def quads_to_tensor(pixels, f, *args, **kwargs):
        lines_from.append(pixels)
        return real_quads(pixels, f, *args, **kwargs)

    monkeypatch.setattr(cv2, "cvtColor", cvt)
    monkeypatch.setattr(kernels, "to_rgb", to_rgb)
    monkeypatch.setattr(kernels, "frame_to_tensor", to_tensor)
    monkeypatch.setattr(kernels, "quads_to_tensor", quads_to_tensor)
    # when the model reads it
    lines = ocr.predict(frame, fmt=fmt)
    # then the kernels got the camera's own buffer (the detector's tensor, then the lines:
    # one call per recogniser width), and nothing was converted on the way
    assert [d.text for d in lines] == ["GATE 12", "MSCU1234565"]
    # (the zoom, where it runs, is handed small regions cut in the frame's own format)
    assert handed[0] is frame and all(h.size <= frame.size // 4 for h in handed[1:])
    assert 1 <= len(lines_from) <= 2 and all(p is frame for p in lines_from)
    assert converted == [] and regions == []


@pytest.fixture(scope="module")
def heavy():
    settings = ExecutionSettings(
        backends=["onnxruntime-cpu"], intra_op_threads=1, batching=BatcherSettings(enabled=False)
    )
    with load_model("ppocr-heavy", settings=settings) as model:
        yield model


@pytest.mark.parametrize("turn", ["upright", "upside down", "a quarter turn"])
def test_the_angle_classifier_and_second_reads_work_on_quads_of_the_frame(heavy, turn):
    # given the scene upside down or turned (its lines vertical), as an NV12 camera frame
    rgb = camera_scene()
    rgb = {"upright": rgb, "upside down": rgb[::-1, ::-1], "a quarter turn": np.rot90(rgb)}[turn]
    frame = as_format(np.ascontiguousarray(rgb), "nv12")
    # when a pipeline with an angle classifier and a padded second read (tta) reads it
    lines = heavy.predict(frame, fmt="nv12")
    # then vertical lines are read turned, upside-down ones flipped: the text is right
    assert sorted(d.text for d in lines) == ["GATE 12", "MSCU1234565"]


def test_enhanced_reads_come_from_the_crop_and_vote_with_the_others():
    settings = ExecutionSettings(
        backends=["onnxruntime-cpu"], intra_op_threads=1, batching=BatcherSettings(enabled=False)
    )
    with load_model("ppocr6-cloud", settings=settings) as cloud:  # tta and enhance on
        assert cloud.opts.tta and cloud.opts.enhance
        for fmt in ("bgr", "i420"):
            lines = cloud.predict(as_format(camera_scene(), fmt), fmt=fmt)
            assert [d.text for d in lines] == ["GATE 12", "MSCU1234565"]


@pytest.mark.parametrize(
    "pixels,fmt,why",
    [
        (np.zeros((48, 64, 3), np.uint8), "yuyv", "unknown pixel format"),
        (np.zeros((48, 64, 3), np.uint8), "nv12", r"\(H\*3/2, W\)"),
        (np.zeros((49, 64), np.uint8), "i420", "multiple of 3"),
        (np.zeros((45, 63), np.uint8), "nv12", "even"),
        (np.zeros((72, 64), np.uint16), "nv12", "uint8"),
    ],
)
def test_a_frame_that_is_not_what_its_format_says_is_a_typed_error(ocr, pixels, fmt, why):
    with pytest.raises(InvalidInput, match=why):
        ocr.predict(pixels, fmt=fmt)
