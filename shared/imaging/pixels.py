"""Pixel normalisation: every decoded image leaves as RGB uint8 HxWx3, C-contiguous.

Rules (stated once, used by the Pillow and the raw-TIFF paths alike):
- 16-bit samples map to 8-bit by round(x / 257), so 65535 -> 255 and 257*k -> k.
- Alpha is composited on black (out = rgb * a / 255, rounded), not dropped, so fully
  transparent pixels are black whatever colour they hide. Premultiplied alpha is already
  on black and is simply removed.
- Gray is replicated to three channels; palette images are expanded through the palette.
- EXIF orientation (1-8) is applied, so the array is upright as a viewer shows it.
"""

from __future__ import annotations

import cv2
import numpy as np
from PIL import Image

from edgefleet.shared.errors import UnsupportedMediaType


def u16_to_u8(a: np.ndarray) -> np.ndarray:
    """round(x / 257) for any-endian uint16, same shape."""
    native = np.ascontiguousarray(a, dtype=np.uint16)
    flat = native.reshape(native.shape[0], -1)
    return cv2.convertScaleAbs(flat, alpha=1.0 / 257.0).reshape(a.shape)


def composite_gray_alpha(gray: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Gray over black: gray * alpha / 255, rounded."""
    return cv2.multiply(np.ascontiguousarray(gray), np.ascontiguousarray(alpha), scale=1.0 / 255.0)


def composite_rgba_on_black(rgba: np.ndarray) -> np.ndarray:
    """(..., 4) RGBA uint8 -> (..., 3) RGB over black."""
    shape = rgba.shape
    flat = np.ascontiguousarray(rgba).reshape(shape[0], -1, 4)
    premultiplied = cv2.cvtColor(flat, cv2.COLOR_RGBA2mRGBA)
    return cv2.cvtColor(premultiplied, cv2.COLOR_RGBA2RGB).reshape(*shape[:-1], 3)


def gray_to_rgb(gray: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(np.ascontiguousarray(gray), cv2.COLOR_GRAY2RGB)


def apply_orientation(rgb: np.ndarray, orientation: int) -> np.ndarray:
    """Make an image upright according to its EXIF orientation tag (1-8)."""
    if orientation == 2:
        return cv2.flip(rgb, 1)
    if orientation == 3:
        return cv2.rotate(rgb, cv2.ROTATE_180)
    if orientation == 4:
        return cv2.flip(rgb, 0)
    if orientation == 5:
        return cv2.transpose(rgb)
    if orientation == 6:
        return cv2.rotate(rgb, cv2.ROTATE_90_CLOCKWISE)
    if orientation == 7:
        return cv2.flip(cv2.transpose(rgb), -1)
    if orientation == 8:
        return cv2.rotate(rgb, cv2.ROTATE_90_COUNTERCLOCKWISE)
    return rgb


def pil_to_rgb(im: Image.Image) -> np.ndarray:
    """A loaded Pillow image of any mode -> RGB uint8 (rules in the module docstring)."""
    mode = im.mode
    if mode == "RGB":
        return np.array(im)  # a writable copy: Pillow's buffer is read-only
    if mode == "L":
        return gray_to_rgb(np.asarray(im))
    if mode in ("I;16", "I;16L", "I;16B", "I;16N"):
        return gray_to_rgb(u16_to_u8(np.asarray(im)))
    if mode == "I":
        # 32-bit integer images come from 16-bit sources: clip to the 16-bit range
        return gray_to_rgb(u16_to_u8(np.clip(np.asarray(im), 0, 65535)))
    if mode == "LA":
        la = np.asarray(im)
        return gray_to_rgb(composite_gray_alpha(la[..., 0], la[..., 1]))
    if mode == "La":
        return gray_to_rgb(np.asarray(im)[..., 0])
    if mode in ("RGBA", "PA") or (mode == "P" and "transparency" in im.info):
        rgba = np.asarray(im if mode == "RGBA" else im.convert("RGBA"))
        return composite_rgba_on_black(rgba)
    if mode in ("RGBa", "RGBX"):
        return np.ascontiguousarray(np.asarray(im)[..., :3])
    if mode == "F":
        raise UnsupportedMediaType(
            "floating-point samples are not supported: send 8- or 16-bit integer images"
        )
    try:
        converted = im.convert("RGB")  # 1, P, CMYK, YCbCr, LAB, HSV
    except ValueError as exc:
        raise UnsupportedMediaType(f"pixel mode {mode} cannot be converted to RGB") from exc
    return np.array(converted)
