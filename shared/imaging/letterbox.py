"""The letterbox transform: keep aspect ratio, pad, and remember how to map back."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
