"""The native C backend: validates in Python, then runs `edgefleet.shared.kernels._native`.

Everything the C code relies on (dtype, shape, contiguity, finite values) is checked
here with typed errors; the extension repeats the length checks as a second line.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from edgefleet.shared.errors import InvalidInput
from edgefleet.shared.imaging.letterbox import LetterboxTransform
from edgefleet.shared.kernels import _native, checks

FORMAT_CODES = {"nv12": 0, "i420": 1, "bgr": 2, "rgb": 3}
BGR_OUT = 16  # or'ed into the format code: planes out in B, G, R order
IMPL_AUTO, IMPL_PORTABLE = 0, 1

_threads = max(1, min(4, os.cpu_count() or 1))
logger = logging.getLogger(__name__)


def _warn_if_stale() -> None:
    """An editable install does not rebuild the extension when src/*.c change: say so."""
    try:
        built = Path(_native.__file__).stat().st_mtime
        sources = Path(__file__).with_name("src").glob("*.[ch]")
        newer = [p.name for p in sources if p.stat().st_mtime > built]
    except OSError:
        return
    if newer:
        logger.warning("native kernels are older than %s: run `pip install -e .`", newer)


_warn_if_stale()


def set_threads(n: int) -> None:
    """How many threads one pre-processing call may use (rows are split between them)."""
    global _threads
    if not isinstance(n, int) or n < 1:
        raise InvalidInput(f"threads must be a positive integer, got {n!r}")
    _threads = n


def name() -> str:
    return "neon" if _native.have_neon() else "c"


def frame_to_tensor(
    frame: np.ndarray,
    fmt: str,
    size: object,
    mean=(0.0, 0.0, 0.0),
    std=(1.0, 1.0, 1.0),
    pad: object = 114,
    dtype: object = np.float32,
    out: np.ndarray | None = None,
    channels: str = "rgb",
    stretch: bool = False,
    *,
    impl: int = IMPL_AUTO,
    threads: int | None = None,
) -> tuple[np.ndarray, LetterboxTransform]:
    """Fused colour conversion, letterbox resize, normalisation and NCHW layout."""
    swap = checks.channel_order(channels)
    h, w = checks.frame_hw(frame, fmt)
    hw, norm, dt = checks.tensor_args(size, mean, std, pad, dtype)
    buf = checks.out_buffer(out, hw, dt)
    t = (LetterboxTransform.stretch if stretch else LetterboxTransform.plan)((h, w), hw)
    scale, bias, pad_value = norm.fixed_point_affine()
    _native.preprocess(
        frame,
        FORMAT_CODES[fmt] | (BGR_OUT if swap else 0),
        h,
        w,
        t.dst_h,
        t.dst_w,
        t.new_h,
        t.new_w,
        t.pad_top,
        t.pad_left,
        scale,
        bias,
        pad_value,
        buf,
        int(dt == np.float16),
        impl,
        _threads if threads is None else threads,
    )
    return buf, t


def nms(
    boxes: np.ndarray,
    scores: np.ndarray,
    iou_threshold: float,
    score_threshold: float = 0.0,
    class_ids: np.ndarray | None = None,
    max_det: int = 300,
    *,
    impl: int = IMPL_AUTO,
) -> np.ndarray:
    a = checks.nms_args(boxes, scores, iou_threshold, score_threshold, class_ids, max_det)
    keep = np.empty(min(len(a.scores), a.max_det), np.int64)
    n = _native.nms(
        a.boxes, a.scores, a.class_ids, a.iou_threshold, a.score_threshold, a.max_det, keep, impl
    )
    return keep[:n].copy() if n < len(keep) else keep


def keypoint_nms(
    keypoints: np.ndarray,
    scores: np.ndarray,
    oks_threshold: float = 0.5,
    score_threshold: float = 0.0,
    boxes: np.ndarray | None = None,
    sigmas: np.ndarray | None = None,
    max_det: int = 300,
) -> np.ndarray:
    a = checks.keypoint_nms_args(
        keypoints, scores, oks_threshold, score_threshold, boxes, sigmas, max_det
    )
    keep = np.empty(min(len(a.scores), a.max_det), np.int64)
    n = _native.keypoint_nms(
        a.keypoints,
        a.scores,
        a.areas,
        a.sigmas,
        a.keypoints.shape[1],
        a.oks_threshold,
        a.score_threshold,
        a.max_det,
        keep,
    )
    return keep[:n].copy() if n < len(keep) else keep


def quads_to_tensor(
    frame: np.ndarray,
    fmt: str,
    quads: np.ndarray,
    widths: np.ndarray,
    slots: np.ndarray,
    out: np.ndarray,
    mean=(0.0, 0.0, 0.0),
    std=(1.0, 1.0, 1.0),
    fill: float = 0.0,
    channels: str = "rgb",
    *,
    threads: int | None = None,
) -> np.ndarray:
    """Text-line quads sampled, colour-converted and normalised into slots of `out`."""
    h, w = checks.frame_hw(frame, fmt)
    a = checks.line_args((h, w), quads, widths, slots, out, mean, std, fill, channels)
    _native.quads_to_tensor(
        frame,
        FORMAT_CODES[fmt] | (BGR_OUT if a.bgr_out else 0),
        h,
        w,
        a.homographies,
        a.taps,
        a.widths,
        a.slots,
        a.out,
        a.out.shape[2],
        a.out.shape[3],
        a.scale,
        a.bias,
        a.fill,
        _threads if threads is None else threads,
    )
    return a.out
