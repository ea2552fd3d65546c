"""A model input in the pixel format the camera delivered: BGR from OpenCV, NV12/I420 from
GStreamer/V4L2, RGB from decoded uploads. Models hand it to the kernels as it is; nothing
converts the whole frame on the way (the kernel converts while it resizes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from edgefleet.shared import kernels
from edgefleet.shared.errors import InvalidInput
from edgefleet.shared.kernels import checks
from edgefleet.shared.kernels.crops import crop_windows, sub_frame

PixelFormat = Literal["rgb", "bgr", "nv12", "i420"]
PIXEL_FORMATS: tuple[str, ...] = get_args(PixelFormat)


@dataclass(frozen=True)
class FrameIn:
    """Pixels and their format; `hw` is the picture's (height, width)."""

    pixels: np.ndarray
    fmt: PixelFormat = "rgb"

    @classmethod
    def checked(cls, pixels: object, fmt: str = "rgb") -> FrameIn:
        """A valid frame, or InvalidInput saying what is wrong (before any native code)."""
        if fmt not in PIXEL_FORMATS:
            raise InvalidInput(f"unknown pixel format {fmt!r}; one of {PIXEL_FORMATS}")
        if not isinstance(pixels, np.ndarray):
            raise InvalidInput(f"expected a numpy array, got {type(pixels).__name__}")
        if fmt in ("rgb", "bgr") and not pixels.flags.c_contiguous:
            pixels = np.ascontiguousarray(pixels)  # a view (a crop, a flip): the kernels need rows
        checks.frame_hw(pixels, fmt)
        return cls(pixels, fmt)  # type: ignore[arg-type]  # fmt checked above

    @property
    def hw(self) -> tuple[int, int]:
        h, w = self.pixels.shape[:2]
        return (h * 2 // 3, w) if self.fmt in ("nv12", "i420") else (h, w)

    @property
    def is_bgr(self) -> bool:
        return self.fmt == "bgr"

    def region(self, x0: float, y0: float, x1: float, y1: float) -> tuple[np.ndarray, int, int]:
        """The pixels of a box as packed (h, w, 3), RGB or BGR as stored (YUV: only this
        region is converted, to RGB), and the region's top-left corner in the frame."""
        box = np.array([[x0, y0, x1, y1]], np.float32)
        win = crop_windows(box, self.hw, self.fmt)[0]
        if self.fmt in ("rgb", "bgr"):
            return self.pixels[win[1] : win[3], win[0] : win[2]], win[0], win[1]
        sub = sub_frame(self.pixels, self.fmt, self.hw, win)
        return kernels.to_rgb(sub, self.fmt), win[0], win[1]
