"""Letterbox, normalise and the whole reference chain the kernels are checked against."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from edgefleet.shared.errors import InvalidInput
from edgefleet.shared.imaging import LetterboxTransform, letterbox, preprocess_reference, to_tensor

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def image(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize(
    "src, dst",
    [
        ((720, 1280), (640, 640)),
        ((1080, 607), (640, 640)),
        ((33, 97), (320, 256)),
        ((5, 5), (8, 4)),
    ],
)
def test_letterbox_places_the_resized_image_on_padding(src, dst):
    # given an image and a model size
    rgb = image(*src)
    # when letterboxed
    canvas, t = letterbox(rgb, dst, pad=114)
    # then the transform is the pinned plan and the canvas holds cv2's resize at its offset
    assert t == LetterboxTransform.plan(src, dst)
    assert canvas.shape == (*dst, 3) and canvas.dtype == np.uint8 and canvas.flags.c_contiguous
    inner = canvas[t.pad_top : t.pad_top + t.new_h, t.pad_left : t.pad_left + t.new_w]
    expected = cv2.resize(rgb, (t.new_w, t.new_h), interpolation=cv2.INTER_LINEAR)
    assert np.array_equal(inner, expected)
    mask = np.ones(dst, bool)
    mask[t.pad_top : t.pad_top + t.new_h, t.pad_left : t.pad_left + t.new_w] = False
    assert (canvas[mask] == 114).all()
    assert t.pad_top + t.new_h <= dst[0] and t.pad_left + t.new_w <= dst[1]


def test_letterbox_same_size_is_a_copy():
    rgb = image(64, 48)
    canvas, t = letterbox(rgb, (64, 48), pad=0)
    assert (t.pad_top, t.pad_left, t.new_h, t.new_w) == (0, 0, 64, 48)
    assert np.array_equal(canvas, rgb)
    canvas[0, 0] = 1 + rgb[0, 0] % 200
    assert not np.array_equal(canvas, rgb)  # the caller's image is untouched


@pytest.mark.parametrize("src", [(720, 1280), (1080, 607), (37, 1001)])
def test_points_round_trip_between_source_and_model(src):
    t = LetterboxTransform.plan(src, (640, 640))
    rng = np.random.default_rng(1)
    pts = rng.uniform(0, 1, (500, 2)) * [src[1], src[0]]
    back = t.points_to_source(t.points_to_model(pts))
    assert np.allclose(back, pts, atol=1e-3 * max(src))
    boxes = np.sort(rng.uniform(0, 1, (50, 2, 2)) * [src[1], src[0]], axis=1).reshape(-1, 4)
    model_boxes = t.points_to_model(boxes.reshape(-1, 2, 2)).reshape(-1, 4)
    assert np.allclose(t.boxes_to_source(model_boxes), boxes, atol=1e-3 * max(src))


def test_a_drawn_box_maps_back_to_where_it_was():
    # given a white rectangle on black at a known place in a 720x1280 frame
    rgb = np.zeros((720, 1280, 3), np.uint8)
    x0, y0, x1, y1 = 300, 200, 700, 500
    rgb[y0:y1, x0:x1] = 255
    # when letterboxed and found again on the canvas
    canvas, t = letterbox(rgb, (640, 640), pad=0)
    ys, xs = np.nonzero(canvas[..., 0] > 127)
    found = np.array([[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]], np.float32)
    # then mapping the canvas box back lands on the source box within one canvas pixel
    back = t.boxes_to_source(found)[0]
    assert np.abs(back - [x0, y0, x1, y1]).max() <= 1 / t.scale_x + 1e-3


def test_letterbox_refuses_bad_inputs():
    with pytest.raises(InvalidInput, match="HxWx3"):
        letterbox(image(4, 4)[..., 0], (8, 8))
    with pytest.raises(InvalidInput, match="HxWx3"):
        letterbox(image(4, 4).astype(np.float32), (8, 8))
    with pytest.raises(InvalidInput, match="positive"):
        letterbox(image(4, 4), (0, 8))
    with pytest.raises(InvalidInput, match="pad"):
        letterbox(image(4, 4), (8, 8), pad=300)


def test_to_tensor_normalises_and_lays_out_nchw():
    canvas = image(6, 10)
    out = to_tensor(canvas, MEAN, STD)
    assert out.shape == (1, 3, 6, 10) and out.dtype == np.float32 and out.flags.c_contiguous
    expected = (canvas.astype(np.float64) / 255 - MEAN) / STD
    assert np.allclose(out[0], expected.transpose(2, 0, 1), atol=1e-5)
    assert np.array_equal(to_tensor(canvas)[0, 0], canvas[..., 0].astype(np.float32) / 255)
    half = to_tensor(canvas, MEAN, STD, np.float16)
    assert half.dtype == np.float16 and half.flags.c_contiguous
    assert np.array_equal(half, out.astype(np.float16))


def test_to_tensor_refuses_bad_arguments():
    with pytest.raises(InvalidInput, match="zero"):
        to_tensor(image(2, 2), MEAN, (1, 0, 1))
    with pytest.raises(InvalidInput, match="three"):
        to_tensor(image(2, 2), (0.5, 0.5))
    with pytest.raises(InvalidInput, match="float32 or float16"):
        to_tensor(image(2, 2), dtype=np.int8)
    with pytest.raises(InvalidInput, match="HxWx3"):
        to_tensor(image(2, 2).astype(np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_preprocess_reference_is_the_chain_spelled_out(dtype):
    # given a 1280x720 NV12 frame
    w, h = 1280, 720
    nv12 = np.random.default_rng(2).integers(0, 256, (h * 3 // 2, w), dtype=np.uint8)
    # when the reference runs
    tensor, t = preprocess_reference(nv12, (640, 640), MEAN, STD, 114, dtype)
    # then it equals cv2 NV12->RGB, INTER_LINEAR resize, pad 114, normalise, NCHW
    rgb = cv2.cvtColor(nv12, cv2.COLOR_YUV2RGB_NV12)
    canvas = np.full((640, 640, 3), 114, np.uint8)
    canvas[140:500, 0:640] = cv2.resize(rgb, (640, 360), interpolation=cv2.INTER_LINEAR)
    expected = ((canvas.astype(np.float32) / 255 - np.float32(MEAN)) / np.float32(STD)).astype(
        dtype
    )
    assert t == LetterboxTransform.plan((h, w), (640, 640))
    assert (t.pad_top, t.new_h) == (140, 360)
    assert tensor.shape == (1, 3, 640, 640) and tensor.dtype == dtype
    assert np.array_equal(tensor[0], expected.transpose(2, 0, 1))


def test_preprocess_reference_needs_a_shaped_nv12_frame():
    with pytest.raises(InvalidInput, match=r"H\*3/2"):
        preprocess_reference(np.zeros(1280 * 1080, np.uint8), (640, 640))
    with pytest.raises(InvalidInput, match=r"H\*3/2"):
        preprocess_reference(np.zeros((1081, 1280), np.uint8), (640, 640))
