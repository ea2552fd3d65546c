"""Pixels to model input: (x * scale - mean) / std in the model's channel order, NCHW.

One definition for the models (their pre-processing) and the executor (TensorRT INT8
calibration feeds the same tensors), so it lives here, below both.
"""

from __future__ import annotations

import cv2
import numpy as np

from edgefleet.shared.imaging.letterbox import LetterboxTransform


def normalise(
    image: np.ndarray, mean: list[float], std: list[float], scale: float, bgr: bool
) -> np.ndarray:
    """HxWx3 uint8 (RGB) -> 3xHxW float32 ((x * scale - mean) / std), in the model's order."""
    px = image[..., ::-1] if bgr else image
    m = np.asarray(mean, np.float32).reshape(1, 1, 3)
    s = np.asarray(std, np.float32).reshape(1, 1, 3)
    # x * (scale / s) - m / s in one pass is the same as ((x * scale) - m) / s
    out = px.astype(np.float32) * (np.float32(scale) / s) - (m / s)
    return np.ascontiguousarray(out.transpose(2, 0, 1))


def pad_norm_value(pad: int, mean: list[float], std: list[float], scale: float, bgr: bool):
    """The normalised value (per channel, model order) of a padding pixel."""
    pixel = np.full((1, 1, 3), pad, np.uint8)
    return normalise(pixel, mean, std, scale, bgr).reshape(3)


def letterbox_into(
    canvas: np.ndarray,
    image: np.ndarray,
    transform: LetterboxTransform,
    mean: list[float],
    std: list[float],
    scale: float,
    bgr: bool,
) -> None:
    """Resize `image` per `transform` and write it, normalised, into canvas (3, H, W)."""
    interp = cv2.INTER_AREA if transform.new_w < transform.src_w else cv2.INTER_LINEAR
    resized = cv2.resize(image, (transform.new_w, transform.new_h), interpolation=interp)
    t, left = transform.pad_top, transform.pad_left
    canvas[:, t : t + transform.new_h, left : left + transform.new_w] = normalise(
        resized, mean, std, scale, bgr
    )
