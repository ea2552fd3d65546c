"""Camera frames for the tests: a scene in the pixel formats sources deliver."""

from __future__ import annotations

import cv2
import numpy as np


def as_format(rgb: np.ndarray, fmt: str) -> np.ndarray:
    """The scene as a camera would deliver it: BGR (OpenCV), NV12 or I420 (GStreamer/V4L2)."""
    if fmt == "rgb":
        return rgb
    if fmt == "bgr":
        return np.ascontiguousarray(rgb[..., ::-1])
    i420 = cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420)
    if fmt == "i420":
        return i420
    h, w = rgb.shape[:2]
    flat = i420.reshape(-1)
    u = flat[h * w : h * w * 5 // 4].reshape(h // 2, w // 2)
    v = flat[h * w * 5 // 4 :].reshape(h // 2, w // 2)
    uv = np.stack([u, v], axis=-1).reshape(h // 2, w)
    return np.concatenate([i420[:h], uv])
