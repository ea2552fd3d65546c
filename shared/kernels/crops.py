"""crop_resize: many boxes of one frame, each letterboxed into one slot of a batch.

For OCR lines and escalation crops: only the cropped pixels are colour-converted and
resampled (by the active backend's fused kernel), never the whole frame. Crops are cut
on whole pixels (floor/ceil of the box, clipped to the frame; on even coordinates for
4:2:0 frames so chroma stays aligned), so each slot equals the reference pipeline run
on `to_rgb(frame)[y0:y1, x0:x1]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgefleet.shared.errors import InvalidInput
from edgefleet.shared.imaging.letterbox import LetterboxTransform
from edgefleet.shared.kernels import checks


@dataclass(frozen=True)
class CropPlacement:
    """Where slot i came from: the crop's origin in the frame and its letterbox."""

    x0: int
    y0: int
    transform: LetterboxTransform

    def boxes_to_frame(self, boxes: np.ndarray) -> np.ndarray:
        """(N, 4) xyxy in the slot's model coordinates -> frame pixels."""
        out = self.transform.boxes_to_source(boxes)
        out[:, 0::2] += self.x0
        out[:, 1::2] += self.y0
        return out


def crop_windows(boxes: object, hw: tuple[int, int], fmt: str) -> list[tuple[int, int, int, int]]:
    """Integer (x0, y0, x1, y1) crops for float xyxy boxes; never empty."""
    b = np.asarray(boxes) if isinstance(boxes, np.ndarray) else None
    if b is None or b.dtype != np.float32 or b.ndim != 2 or b.shape[1] != 4:
        raise InvalidInput("boxes must be a float32 numpy array of shape (N, 4) xyxy")
    if b.size and not np.isfinite(b).all():
        raise InvalidInput("boxes contain NaN or infinity")
    h, w = hw
    step = 2 if fmt in ("nv12", "i420") else 1
    out = []
    for x1f, y1f, x2f, y2f in b.astype(np.float64).tolist():
        x0, x1 = _span(x1f, x2f, w, step)
        y0, y1 = _span(y1f, y2f, h, step)
        out.append((x0, y0, x1, y1))
    return out


def _span(lo: float, hi: float, limit: int, step: int) -> tuple[int, int]:
    a = min(max(math.floor(min(lo, hi)), 0), limit)
    b = min(max(math.ceil(max(lo, hi)), 0), limit)
    a -= a % step
    b = min(limit, b + (-b) % step)
    if b - a < step:  # empty or outside: the nearest minimal crop inside the frame
        a = min(a, limit - step)
        b = a + step
    return a, b


def sub_frame(frame: np.ndarray, fmt: str, hw: tuple[int, int], win) -> np.ndarray:
    """The crop as a contiguous frame of the same format."""
    h, w = hw
    x0, y0, x1, y1 = win
    if fmt in ("bgr", "rgb"):
        return np.ascontiguousarray(frame[y0:y1, x0:x1])
    if fmt == "nv12":
        return np.concatenate([frame[y0:y1, x0:x1], frame[h + y0 // 2 : h + y1 // 2, x0:x1]])
    planes = frame.reshape(-1)
    y = frame[:h, :][y0:y1, x0:x1]
    u = planes[h * w : h * w * 5 // 4].reshape(h // 2, w // 2)[y0 // 2 : y1 // 2, x0 // 2 : x1 // 2]
    v = planes[h * w * 5 // 4 :].reshape(h // 2, w // 2)[y0 // 2 : y1 // 2, x0 // 2 : x1 // 2]
    flat = np.concatenate([y.reshape(-1), u.reshape(-1), v.reshape(-1)])
    return flat.reshape((y1 - y0) * 3 // 2, x1 - x0)


def crop_resize(
    to_tensor,
    frame: np.ndarray,
    fmt: str,
    boxes: np.ndarray,
    size: object,
    mean=(0.0, 0.0, 0.0),
    std=(1.0, 1.0, 1.0),
    pad: object = 114,
    dtype: object = np.float32,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, list[CropPlacement]]:
    """Crop each box and letterbox it into slot i of an (N, 3, h, w) batch."""
    hw_frame = checks.frame_hw(frame, fmt)
    hw, _, dt = checks.tensor_args(size, mean, std, pad, dtype)
    windows = crop_windows(boxes, hw_frame, fmt)
    shape = (len(windows), 3, *hw)
    if out is None:
        out = np.empty(shape, dt)
    elif not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != dt:
        raise InvalidInput(f"out must be a {dt} numpy array of shape {shape}")
    elif not out.flags.c_contiguous or not out.flags.writeable:
        raise InvalidInput("out must be C-contiguous and writeable")
    placements = []
    for i, win in enumerate(windows):
        sub = sub_frame(frame, fmt, hw_frame, win)
        _, t = to_tensor(sub, fmt, hw, mean, std, pad, dt, out[i : i + 1])
        placements.append(CropPlacement(win[0], win[1], t))
    return out, placements
