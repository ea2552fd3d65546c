"""Input adaptation for the built-in models: letterbox, normalise, lay out as NCHW.

The LetterboxTransform plans where the image lands; these helpers only fill tensors.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from edgefleet.shared.errors import InvalidInput
from edgefleet.shared.imaging.letterbox import LetterboxTransform

MAX_SIDE = 16384


def check_image(image: object) -> np.ndarray:
    """An RGB uint8 HxWx3 array, or InvalidInput saying what is wrong."""
    if not isinstance(image, np.ndarray):
        raise InvalidInput(f"expected a numpy array, got {type(image).__name__}")
    if image.dtype != np.uint8:
        raise InvalidInput(f"expected uint8 pixels, got {image.dtype}")
    if image.ndim != 3 or image.shape[2] != 3:
        raise InvalidInput(f"expected an RGB image of shape (H, W, 3), got {image.shape}")
    h, w = image.shape[:2]
    if min(h, w) < 1 or max(h, w) > MAX_SIDE:
        raise InvalidInput(f"image size {w}x{h} is outside 1..{MAX_SIDE} pixels")
    return image


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


def ceil_to(value: float, multiple: int) -> int:
    return max(multiple, math.ceil(value / multiple) * multiple)


def det_plan(src_hw: tuple[int, int], max_side: int, multiple: int = 32) -> LetterboxTransform:
    """Fit the longest side to `max_side` (shrinking or growing up to 2x), canvas in /32 steps."""
    h, w = src_hw
    s = min(max_side / max(h, w), 2.0)
    dst = (ceil_to(h * s, multiple), ceil_to(w * s, multiple))
    return LetterboxTransform.plan(src_hw, dst)


def stack_canvases(
    images: list[np.ndarray],
    plans: list[LetterboxTransform],
    fill: np.ndarray,
    mean: list[float],
    std: list[float],
    scale: float,
    bgr: bool,
) -> np.ndarray:
    """One (N, 3, H, W) batch; smaller canvases are padded at the bottom/right with `fill`."""
    height = max(p.dst_h for p in plans)
    width = max(p.dst_w for p in plans)
    batch = np.empty((len(images), 3, height, width), np.float32)
    batch[:] = fill.reshape(1, 3, 1, 1)
    for i, (image, plan) in enumerate(zip(images, plans, strict=True)):
        letterbox_into(batch[i], image, plan, mean, std, scale, bgr)
    return batch
