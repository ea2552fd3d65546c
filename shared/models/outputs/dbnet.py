"""PP-OCR text detection post-processing (Differentiable Binarization) to rotated boxes."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
import pyclipper


@dataclass(frozen=True)
class DBParams:
    thresh: float = 0.3
    box_thresh: float = 0.5
    unclip_ratio: float = 1.6
    max_candidates: int = 1000
    min_size: float = 3.0
    dilate: bool = True


def _mini_box(contour: np.ndarray) -> tuple[np.ndarray, float]:
    """Minimum-area rectangle as 4 points ordered tl, tr, br, bl, and its short side."""
    rect = cv2.minAreaRect(contour)
    return order_quad(cv2.boxPoints(rect)), float(min(rect[1]))


def order_quad(points: np.ndarray) -> np.ndarray:
    """Order 4 points as top-left, top-right, bottom-right, bottom-left."""
    pts = np.asarray(points, dtype=np.float32).reshape(4, 2)
    by_x = pts[np.argsort(pts[:, 0], kind="stable")]
    left = by_x[:2][np.argsort(by_x[:2, 1], kind="stable")]
    right = by_x[2:][np.argsort(by_x[2:, 1], kind="stable")]
    return np.array([left[0], right[0], right[1], left[1]], dtype=np.float32)


def _box_score(prob: np.ndarray, box: np.ndarray) -> float:
    """Mean probability inside the quad (the 'fast' score of PP-OCR)."""
    h, w = prob.shape
    x0 = int(np.clip(np.floor(box[:, 0].min()), 0, w - 1))
    x1 = int(np.clip(np.ceil(box[:, 0].max()), 0, w - 1))
    y0 = int(np.clip(np.floor(box[:, 1].min()), 0, h - 1))
    y1 = int(np.clip(np.ceil(box[:, 1].max()), 0, h - 1))
    mask = np.zeros((y1 - y0 + 1, x1 - x0 + 1), dtype=np.uint8)
    shifted = (box - np.array([x0, y0], dtype=np.float32)).astype(np.int32)
    cv2.fillPoly(mask, [shifted.reshape(-1, 2)], 1)
    return float(cv2.mean(prob[y0 : y1 + 1, x0 : x1 + 1], mask)[0])


def _unclip(box: np.ndarray, ratio: float) -> np.ndarray | None:
    """Grow the shrunk text kernel back by area * ratio / perimeter (the DB paper's rule)."""
    area = abs(cv2.contourArea(box))
    length = cv2.arcLength(box.reshape(-1, 1, 2), True)
    if length <= 0:
        return None
    offset = pyclipper.PyclipperOffset()
    offset.AddPath(box.astype(np.int64).tolist(), pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    expanded = offset.Execute(area * ratio / length)
    if len(expanded) != 1:
        return None
    return np.asarray(expanded[0], dtype=np.float32).reshape(-1, 1, 2)


def db_boxes(prob: np.ndarray, params: DBParams) -> tuple[np.ndarray, np.ndarray]:
    """Text quads (N, 4, 2) in the probability map's pixels, and their scores (N,)."""
    bitmap: np.ndarray = (prob > params.thresh).astype(np.uint8)
    if params.dilate:
        bitmap = cv2.dilate(bitmap, np.ones((2, 2), dtype=np.uint8))
    contours, _ = cv2.findContours(bitmap * 255, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    boxes, scores = [], []
    for contour in contours[: params.max_candidates]:
        quad, short = _mini_box(contour)
        if short < params.min_size:
            continue
        score = _box_score(prob, quad)
        if score < params.box_thresh:
            continue
        grown = _unclip(quad, params.unclip_ratio)
        if grown is None:
            continue
        quad, short = _mini_box(grown)
        if short < params.min_size + 2:
            continue
        boxes.append(quad)
        scores.append(score)
    if not boxes:
        return np.zeros((0, 4, 2), np.float32), np.zeros((0,), np.float32)
    return np.stack(boxes).astype(np.float32), np.asarray(scores, np.float32)
