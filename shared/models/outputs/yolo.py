"""YOLO-family outputs (v5 and v8/v11 layouts) to boxes, with class-aware NMS.

v5: (N, 5 + C) rows of cx, cy, w, h, objectness, class scores (score = obj * cls).
v8/v11: (4 + C, N) columns of cx, cy, w, h, class scores (no objectness), transposed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgefleet.shared import kernels


@dataclass(frozen=True)
class YoloDetections:
    boxes: np.ndarray  # (K, 4) xyxy in model canvas pixels
    scores: np.ndarray  # (K,)
    class_ids: np.ndarray  # (K,) int


def detect_layout(output: np.ndarray, num_classes: int | None) -> str:
    """'v5' or 'v8' for one image's 2-D output, from its shape (and the class count)."""
    if output.ndim != 2:
        raise ValueError(f"YOLO output per image must be 2-D, got {output.shape}")
    rows, cols = output.shape
    if num_classes is not None:
        if cols == 5 + num_classes:
            return "v5"
        if rows == 4 + num_classes:
            return "v8"
        if cols == 4 + num_classes:
            return "v8-rows"
        raise ValueError(f"output {output.shape} fits neither v5 nor v8 with {num_classes} classes")
    return "v8" if rows < cols else "v5"


def decode_yolo(
    output: np.ndarray,
    *,
    layout: str = "auto",
    num_classes: int | None = None,
    conf_threshold: float = 0.25,
    iou_threshold: float = 0.45,
    max_det: int = 300,
) -> YoloDetections:
    """One image's raw output -> boxes after score filter and class-aware NMS."""
    out = np.asarray(output, dtype=np.float32)
    if layout == "auto":
        layout = detect_layout(out, num_classes)
    if layout == "v8":
        out = out.T
        layout = "v8-rows"
    if layout == "v5":
        cls = out[:, 5:] * out[:, 4:5]
    elif layout == "v8-rows":
        cls = out[:, 4:]
    else:
        raise ValueError(f"unknown YOLO layout {layout!r}")
    if cls.shape[1] == 0:
        raise ValueError("YOLO output has no class columns")
    class_ids = cls.argmax(axis=1)
    scores = cls[np.arange(cls.shape[0]), class_ids]
    mask = scores >= conf_threshold
    cxcywh, scores, class_ids = out[mask, :4], scores[mask], class_ids[mask]
    if scores.size == 0:
        return YoloDetections(np.zeros((0, 4), np.float32), scores, class_ids.astype(np.int64))
    half = cxcywh[:, 2:4] / 2
    boxes = np.concatenate([cxcywh[:, :2] - half, cxcywh[:, :2] + half], axis=1)
    keep = kernels.nms(
        np.ascontiguousarray(boxes, np.float32),
        np.ascontiguousarray(scores, np.float32),
        iou_threshold,
        0.0,
        class_ids=class_ids,
        max_det=max_det,
    )
    return YoloDetections(boxes[keep], scores[keep], class_ids[keep].astype(np.int64))
