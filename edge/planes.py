"""What the post stage needs of a frame in its source's format, without converting it whole.

The policy hashes frames (grey), ranks crops by sharpness (grey) and writes JPEGs (BGR).
For NV12/I420 frames the grey image is the Y plane (a view), and only the pixels that go
into a JPEG are colour-converted (BT.601 limited range, as the kernels read YUV), when
they are kept: never the whole frame per frame.
"""

from __future__ import annotations

import cv2
import numpy as np

from edgefleet.shared.kernels.crops import crop_windows, sub_frame

YUV = ("nv12", "i420")
_TO_BGR = {"nv12": cv2.COLOR_YUV2BGR_NV12, "i420": cv2.COLOR_YUV2BGR_I420}

Box = tuple[int, int, int, int]  # x1, y1, x2, y2 in whole pixels


def frame_hw(image: np.ndarray, fmt: str) -> tuple[int, int]:
    """The picture's (height, width)."""
    h, w = image.shape[:2]
    return (h * 2 // 3, w) if fmt in YUV else (h, w)


def gray(image: np.ndarray, fmt: str) -> np.ndarray:
    """A one-channel image of the frame: the Y plane of YUV (no copy), BGR as is (the
    callers convert a packed image themselves, only the part they need)."""
    if fmt in YUV:
        return image[: frame_hw(image, fmt)[0]]
    return image


def bgr_crop(image: np.ndarray, fmt: str, box: Box | None = None) -> np.ndarray:
    """The box's pixels (the whole frame when None) as packed BGR.

    YUV: only the 2-aligned window around the box is converted, then cut to the box.
    """
    h, w = frame_hw(image, fmt)
    x1, y1, x2, y2 = box if box is not None else (0, 0, w, h)
    if fmt not in YUV:
        return image[y1:y2, x1:x2]
    if (x1, y1, x2, y2) == (0, 0, w, h):
        return cv2.cvtColor(image, _TO_BGR[fmt])
    win = crop_windows(np.array([[x1, y1, x2, y2]], np.float32), (h, w), fmt)[0]
    bgr = cv2.cvtColor(sub_frame(image, fmt, (h, w), win), _TO_BGR[fmt])
    return bgr[y1 - win[1] : y2 - win[1], x1 - win[0] : x2 - win[0]]
