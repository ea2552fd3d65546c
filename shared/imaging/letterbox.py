"""The letterbox transform: keep aspect ratio, pad, and remember how to map back."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from edgefleet.shared.errors import InvalidInput


@dataclass(frozen=True)
class LetterboxTransform:
    """How a (src_h, src_w) image was placed on a (dst_h, dst_w) model canvas.

    The resized image is (new_h, new_w) with new = max(1, round(src * scale)) where
    scale = min(dst_h / src_h, dst_w / src_w), centred at (pad_left, pad_top) =
    ((dst_w - new_w) // 2, (dst_h - new_h) // 2). Per-axis scales are kept so that
    coordinates map back exactly, rounding included.
    """

    src_h: int
    src_w: int
    dst_h: int
    dst_w: int
    new_h: int
    new_w: int
    pad_top: int
    pad_left: int

    @classmethod
    def stretch(cls, src_hw: tuple[int, int], dst_hw: tuple[int, int]) -> LetterboxTransform:
        """Fill the whole canvas, each axis scaled on its own (no padding): PP-OCR's detector
        input rule, whose constant pad would otherwise shift the detector's global pooling."""
        src_h, src_w = int(src_hw[0]), int(src_hw[1])
        dst_h, dst_w = int(dst_hw[0]), int(dst_hw[1])
        if min(src_h, src_w, dst_h, dst_w) < 1:
            raise ValueError(f"stretch needs positive sizes, got {src_hw} -> {dst_hw}")
        return cls(src_h, src_w, dst_h, dst_w, dst_h, dst_w, 0, 0)

    @classmethod
    def plan(cls, src_hw: tuple[int, int], dst_hw: tuple[int, int]) -> LetterboxTransform:
        src_h, src_w = int(src_hw[0]), int(src_hw[1])
        dst_h, dst_w = int(dst_hw[0]), int(dst_hw[1])
        if min(src_h, src_w, dst_h, dst_w) < 1:
            raise ValueError(f"letterbox needs positive sizes, got {src_hw} -> {dst_hw}")
        scale = min(dst_h / src_h, dst_w / src_w)
        new_h = min(dst_h, max(1, round(src_h * scale)))
        new_w = min(dst_w, max(1, round(src_w * scale)))
        return cls(
            src_h, src_w, dst_h, dst_w, new_h, new_w, (dst_h - new_h) // 2, (dst_w - new_w) // 2
        )

    @property
    def scale_x(self) -> float:
        return self.new_w / self.src_w

    @property
    def scale_y(self) -> float:
        return self.new_h / self.src_h

    def points_to_source(self, points: np.ndarray) -> np.ndarray:
        """Map (..., 2) x/y points from model canvas to source pixels, clipped to the image."""
        pts = np.asarray(points, dtype=np.float32)
        out = np.empty_like(pts)
        out[..., 0] = np.clip((pts[..., 0] - self.pad_left) / self.scale_x, 0, self.src_w)
        out[..., 1] = np.clip((pts[..., 1] - self.pad_top) / self.scale_y, 0, self.src_h)
        return out

    def boxes_to_source(self, boxes: np.ndarray) -> np.ndarray:
        """Map (N, 4) xyxy boxes from model canvas to source pixels."""
        b = np.asarray(boxes, dtype=np.float32).reshape(-1, 2, 2)
        return self.points_to_source(b).reshape(-1, 4)

    def points_to_model(self, points: np.ndarray) -> np.ndarray:
        pts = np.asarray(points, dtype=np.float32)
        out = np.empty_like(pts)
        out[..., 0] = pts[..., 0] * self.scale_x + self.pad_left
        out[..., 1] = pts[..., 1] * self.scale_y + self.pad_top
        return out


def letterbox(
    rgb: np.ndarray, size: tuple[int, int], pad: int = 114
) -> tuple[np.ndarray, LetterboxTransform]:
    """Resize keeping aspect ratio (cv2 INTER_LINEAR) and centre on a pad-valued canvas.

    `size` is (h, w). The image is resized to (new_w, new_h) from `LetterboxTransform.plan`
    and placed at (pad_left, pad_top); everything else is `pad`. This is the reference
    the fused kernels are checked against.
    """
    arr = np.asarray(rgb)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3 or arr.size == 0:
        raise InvalidInput(f"letterbox needs RGB uint8 HxWx3, got {arr.dtype} {arr.shape}")
    if len(size) != 2 or min(int(size[0]), int(size[1])) < 1:
        raise InvalidInput(f"letterbox size must be two positive ints (h, w), got {size}")
    if not 0 <= int(pad) <= 255:
        raise InvalidInput(f"letterbox pad must be 0-255, got {pad}")
    t = LetterboxTransform.plan(arr.shape[:2], (int(size[0]), int(size[1])))
    canvas = np.full((t.dst_h, t.dst_w, 3), int(pad), dtype=np.uint8)
    if (t.new_h, t.new_w) == (t.src_h, t.src_w):
        resized = arr
    else:
        resized = cv2.resize(arr, (t.new_w, t.new_h), interpolation=cv2.INTER_LINEAR)
    canvas[t.pad_top : t.pad_top + t.new_h, t.pad_left : t.pad_left + t.new_w] = resized
    return canvas, t
