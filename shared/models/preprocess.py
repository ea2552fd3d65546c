"""Input adaptation for the built-in models: letterbox, normalise, lay out as NCHW.

The LetterboxTransform plans where the image lands; these helpers only fill tensors (the
per-pixel normalisation lives in `edgefleet.shared.imaging.normalise`, below the executor,
which calibrates TensorRT with the same numbers).
"""

from __future__ import annotations

import math

import numpy as np

from edgefleet.shared import kernels
from edgefleet.shared.imaging.letterbox import LetterboxTransform
from edgefleet.shared.imaging.normalise import letterbox_into
from edgefleet.shared.models.frames import FrameIn


def ceil_to(value: float, multiple: int) -> int:
    return max(multiple, math.ceil(value / multiple) * multiple)


def det_plan(
    src_hw: tuple[int, int], max_side: int, multiple: int = 32, stretch: bool = False
) -> LetterboxTransform:
    """Fit the longest side to `max_side` (shrinking or growing up to 2x), canvas in /32 steps.

    Letterboxed, the canvas is rounded up and the rest padded; with `stretch` (PP-OCR's
    DetResizeForTest) each side is rounded to the nearest step and the image fills it.
    """
    h, w = src_hw
    s = min(max_side / max(h, w), 2.0)
    if stretch:
        dst = (round_to(h * s, multiple), round_to(w * s, multiple))
        return LetterboxTransform.stretch(src_hw, dst)
    dst = (ceil_to(h * s, multiple), ceil_to(w * s, multiple))
    return LetterboxTransform.plan(src_hw, dst)


def round_to(value: float, multiple: int) -> int:
    return max(multiple, int(value / multiple + 0.5) * multiple)


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


def kernel_batch(
    frames: list[FrameIn],
    plans: list[LetterboxTransform],
    mean: list[float],
    std: list[float],
    pad: int,
    channels: str,
) -> np.ndarray:
    """One (N, 3, H, W) batch filled by the kernels straight from each frame's pixels.

    `mean`/`std` per R, G, B; `plans` from `det_plan` (the kernel letterboxes each frame
    onto its plan's canvas, or stretches it where the plan fills the canvas). A smaller
    canvas in a mixed batch is written at the top left and the rest padded with the pad's
    normalised value.
    """
    height = max(p.dst_h for p in plans)
    width = max(p.dst_w for p in plans)
    batch = np.empty((len(frames), 3, height, width), np.float32)
    for i, (frame, plan) in enumerate(zip(frames, plans, strict=True)):
        size = (plan.dst_h, plan.dst_w)
        stretch = (plan.new_h, plan.new_w) == size
        if size == (height, width):
            kernels.frame_to_tensor(
                frame.pixels, frame.fmt, size, mean, std, pad, out=batch[i : i + 1],
                channels=channels, stretch=stretch,
            )  # fmt: skip
            continue
        one, _ = kernels.frame_to_tensor(
            frame.pixels, frame.fmt, size, mean, std, pad, channels=channels, stretch=stretch
        )
        fill = (pad / 255.0 - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
        batch[i] = (fill[::-1] if channels == "bgr" else fill).reshape(3, 1, 1)
        batch[i, :, : plan.dst_h, : plan.dst_w] = one[0]
    return batch
