"""Camera formats to RGB: the same pixels as OpenCV, and wrong buffer lengths refused."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from edgefleet.shared.errors import InvalidInput
from edgefleet.shared.imaging import (
    bgr_to_rgb,
    i420_to_rgb,
    nv12_to_rgb,
    nv12_to_rgb_formula,
    yuv_to_rgb_bt601,
    yuyv_to_rgb,
)


def frame(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (rows, cols), dtype=np.uint8)


@pytest.mark.parametrize("w, h", [(2, 2), (64, 48), (640, 360), (1920, 1080)])
def test_nv12_matches_cv2_flat_and_shaped(w, h):
    yuv = frame(h * 3 // 2, w, seed=w)
    expected = cv2.cvtColor(yuv, cv2.COLOR_YUV2RGB_NV12)
    out = nv12_to_rgb(yuv, w, h)
    assert out.shape == (h, w, 3) and out.dtype == np.uint8 and out.flags.c_contiguous
    assert np.array_equal(out, expected)
    assert np.array_equal(nv12_to_rgb(yuv.reshape(-1), w, h), expected)
    assert np.array_equal(nv12_to_rgb(yuv.tobytes(), w, h), expected)


def test_nv12_formula_is_bit_exact_with_cv2():
    # given the fixed-point formula documented for the kernels
    w, h = 96, 64
    yuv = frame(h * 3 // 2, w, seed=7)
    assert np.array_equal(nv12_to_rgb_formula(yuv, w, h), nv12_to_rgb(yuv, w, h))
    # and a one-block-high NV12 frame whose 2x2 blocks walk through (Y, U, V) space
    grid = np.arange(256, dtype=np.uint8)
    y, u, v = (a.reshape(-1) for a in np.meshgrid(grid, grid[::5], grid[::3], indexing="ij"))
    n = y.size
    nv12 = np.empty((3, 2 * n), np.uint8)
    nv12[:2] = np.repeat(y, 2)
    nv12[2, 0::2], nv12[2, 1::2] = u, v
    # when both convert / then every combination agrees exactly
    ours = yuv_to_rgb_bt601(y, u, v)
    assert np.array_equal(nv12_to_rgb(nv12, 2 * n, 2)[0, 0::2], ours)


def test_nv12_with_row_pitch():
    w, h, stride = 30, 10, 32
    padded = frame(h * 3 // 2, stride, seed=3)
    expected = cv2.cvtColor(np.ascontiguousarray(padded[:, :w]), cv2.COLOR_YUV2RGB_NV12)
    assert np.array_equal(nv12_to_rgb(padded, w, h, stride=stride), expected)


@pytest.mark.parametrize(
    "length, w, h",
    [(100, 16, 16), (16 * 16, 16, 16), (16 * 16 * 3 // 2 + 1, 16, 16), (0, 16, 16)],
)
def test_nv12_length_mismatch_is_invalid_input(length, w, h):
    with pytest.raises(InvalidInput) as info:
        nv12_to_rgb(np.zeros(length, np.uint8), w, h)
    assert info.value.http_status == 422
    assert str(length) in info.value.message and "384" in info.value.message


def test_bad_sizes_and_dtypes_are_refused():
    with pytest.raises(InvalidInput, match="even"):
        nv12_to_rgb(np.zeros(15 * 3 * 3 // 2 + 1, np.uint8), 15, 3)
    with pytest.raises(InvalidInput, match="positive"):
        nv12_to_rgb(b"", 0, 0)
    with pytest.raises(InvalidInput, match="uint8"):
        nv12_to_rgb(np.zeros((6, 4), np.uint16), 4, 4)
    with pytest.raises(InvalidInput, match="shaped"):
        nv12_to_rgb(np.zeros((4, 6), np.uint8), 4, 4)  # transposed layout, right length
    with pytest.raises(InvalidInput, match="stride"):
        nv12_to_rgb(np.zeros(24, np.uint8), 4, 4, stride=2)


def test_i420_matches_cv2():
    w, h = 64, 36
    yuv = frame(h * 3 // 2, w, seed=5)
    assert np.array_equal(i420_to_rgb(yuv, w, h), cv2.cvtColor(yuv, cv2.COLOR_YUV2RGB_I420))
    with pytest.raises(InvalidInput, match="bytes"):
        i420_to_rgb(yuv.reshape(-1)[:-1], w, h)


def test_yuyv_matches_cv2():
    w, h = 64, 36
    packed = frame(h, w * 2, seed=6).reshape(h, w, 2)
    expected = cv2.cvtColor(packed, cv2.COLOR_YUV2RGB_YUYV)
    assert np.array_equal(yuyv_to_rgb(packed, w, h), expected)
    assert np.array_equal(yuyv_to_rgb(packed.tobytes(), w, h), expected)
    with pytest.raises(InvalidInput, match="bytes"):
        yuyv_to_rgb(packed.tobytes()[:-2], w, h)


def test_bgr_to_rgb():
    bgr = np.random.default_rng(1).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    assert np.array_equal(bgr_to_rgb(bgr), bgr[..., ::-1])
    bgra = np.concatenate([bgr, np.full((5, 7, 1), 9, np.uint8)], axis=2)
    assert np.array_equal(bgr_to_rgb(bgra), bgr[..., ::-1])
    with pytest.raises(InvalidInput, match="HxWx3"):
        bgr_to_rgb(bgr[..., 0])
