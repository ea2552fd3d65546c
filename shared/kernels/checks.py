"""Validation shared by every backend: bad input becomes InvalidInput, never a crash.

Native and CUDA code trust what passes these checks (shape, dtype, contiguity, ranges),
so every public entry point runs them first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgefleet.shared.errors import InvalidInput

MAX_SIDE = 16384
FORMATS = ("nv12", "i420", "bgr", "rgb")
FIXED_POINT = float(255 * (1 << 22))  # colour levels x the two 2^11 bilinear weights


@dataclass(frozen=True)
class Normalise:
    """Per-channel mean/std (on the [0, 1] scale) and the pad value (0..255)."""

    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    pad: int

    def fixed_point_affine(self) -> tuple[list[float], list[float], list[float]]:
        """Per-channel (scale, bias, pad value) the native and CUDA kernels apply.

        Both sum in fixed point (`FIXED_POINT`); one definition keeps them bit-identical.
        """
        scale = [1.0 / (FIXED_POINT * s) for s in self.std]
        bias = [-m / s for m, s in zip(self.mean, self.std, strict=True)]
        pad_value = [(self.pad / 255.0 - m) / s for m, s in zip(self.mean, self.std, strict=True)]
        return scale, bias, pad_value


def _array(name: str, value: object) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise InvalidInput(f"{name} must be a numpy array, got {type(value).__name__}")
    return value


def _contiguous(name: str, arr: np.ndarray) -> None:
    if not arr.flags.c_contiguous:
        raise InvalidInput(
            f"{name} must be C-contiguous", hint="pass np.ascontiguousarray(...) of it"
        )


def frame_hw(frame: object, fmt: str) -> tuple[int, int]:
    """Return the (height, width) of a host camera frame in `fmt`, or raise InvalidInput."""
    arr = _array("frame", frame)
    return frame_geometry(arr.shape, arr.dtype, arr.flags.c_contiguous, fmt)


def frame_geometry(
    shape: tuple[int, ...], dtype: np.dtype, c_contiguous: bool, fmt: str
) -> tuple[int, int]:
    """(height, width) of a frame described by shape/dtype/layout (host or device array)."""
    if np.dtype(dtype) != np.uint8:
        raise InvalidInput(f"frame must be uint8, got {dtype}")
    if not c_contiguous:
        raise InvalidInput("frame must be C-contiguous", hint="pass a contiguous copy of it")
    if fmt in ("nv12", "i420"):
        if len(shape) != 2:
            raise InvalidInput(f"a {fmt} frame has shape (H*3/2, W), got {shape}")
        rows, w = shape
        if rows % 3 or w < 2 or rows < 3:
            raise InvalidInput(f"a {fmt} frame has H*3/2 rows (a multiple of 3), got {shape}")
        h = rows * 2 // 3
        if h % 2 or w % 2:
            raise InvalidInput(f"{fmt} needs an even width and height, got {h}x{w}")
    elif fmt in ("bgr", "rgb"):
        if len(shape) != 3 or shape[2] != 3:
            raise InvalidInput(f"a packed {fmt} frame has shape (H, W, 3), got {shape}")
        h, w = shape[:2]
        if h < 1 or w < 1:
            raise InvalidInput(f"empty frame {shape}")
    else:
        raise InvalidInput(f"unknown frame format {fmt!r}; one of {FORMATS}")
    if h > MAX_SIDE or w > MAX_SIDE:
        raise InvalidInput(f"frame {h}x{w} exceeds {MAX_SIDE} per side")
    return int(h), int(w)


def channel_order(channels: object) -> bool:
    """True when the planes go out in B, G, R order ('bgr'), False for 'rgb'."""
    if channels not in ("rgb", "bgr"):
        raise InvalidInput(f"channels must be 'rgb' or 'bgr', got {channels!r}")
    return channels == "bgr"


def model_size(size: object) -> tuple[int, int]:
    """The model input (height, width): two positive integers."""
    unchecked: Any = size  # whatever does not unpack to two integers is refused here
    try:
        h, w = unchecked
        h_i, w_i = int(h), int(w)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"size must be (height, width), got {size!r}") from exc
    if h_i != h or w_i != w or not (1 <= h_i <= MAX_SIDE and 1 <= w_i <= MAX_SIDE):
        raise InvalidInput(f"size must be two integers in 1..{MAX_SIDE}, got {size!r}")
    return h_i, w_i


def _triple(name: str, value: object) -> tuple[float, float, float]:
    unchecked: Any = value  # whatever is not three numbers is refused here
    try:
        vals = tuple(float(v) for v in unchecked)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{name} must be three numbers, got {value!r}") from exc
    if len(vals) != 3 or not all(math.isfinite(v) for v in vals):
        raise InvalidInput(f"{name} must be three finite numbers, got {value!r}")
    return vals[0], vals[1], vals[2]


def normalise(mean: Sequence[float], std: Sequence[float], pad: object) -> Normalise:
    m, s = _triple("mean", mean), _triple("std", std)
    if any(v == 0.0 for v in s):
        raise InvalidInput(f"std must be non-zero, got {std!r}")
    unchecked: Any = pad  # whatever is not an integer 0..255 is refused here
    try:
        pad_i = int(unchecked)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"pad must be an integer 0..255, got {pad!r}") from exc
    if pad_i != pad or not 0 <= pad_i <= 255:
        raise InvalidInput(f"pad must be an integer 0..255, got {pad!r}")
    return Normalise(m, s, pad_i)


def out_dtype(dtype: object) -> np.dtype:
    unchecked: Any = dtype  # whatever is not float32 or float16 is refused here
    try:
        dt = np.dtype(unchecked)
    except TypeError as exc:
        raise InvalidInput(f"dtype must be float32 or float16, got {dtype!r}") from exc
    if dt not in (np.dtype(np.float32), np.dtype(np.float16)):
        raise InvalidInput(f"dtype must be float32 or float16, got {dt}")
    return dt


def tensor_args(
    size: object, mean: Sequence[float], std: Sequence[float], pad: object, dtype: object
) -> tuple[tuple[int, int], Normalise, np.dtype]:
    """The checked model size, normalisation and output dtype of a pre-processing call."""
    return model_size(size), normalise(mean, std, pad), out_dtype(dtype)


def out_buffer(out: object, size: tuple[int, int], dtype: np.dtype) -> np.ndarray:
    """The caller's output buffer (1, 3, h, w), or a new one."""
    shape = (1, 3, size[0], size[1])
    if out is None:
        return np.empty(shape, dtype)
    arr = _array("out", out)
    if arr.shape != shape:
        raise InvalidInput(f"out must have shape {shape}, got {arr.shape}")
    if arr.dtype != dtype:
        raise InvalidInput(f"out must be {dtype}, got {arr.dtype}")
    _contiguous("out", arr)
    if not arr.flags.writeable:
        raise InvalidInput("out is read-only")
    return arr


@dataclass(frozen=True)
class NmsArgs:
    boxes: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray | None
    iou_threshold: float
    score_threshold: float
    max_det: int


def _threshold(name: str, value: object) -> float:
    unchecked: Any = value  # whatever is not a finite number is refused here
    try:
        f = float(unchecked)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{name} must be a number, got {value!r}") from exc
    if not math.isfinite(f):
        raise InvalidInput(f"{name} must be finite, got {value!r}")
    return f


def _max_det(max_det: object) -> int:
    if isinstance(max_det, bool) or not isinstance(max_det, (int, np.integer)) or max_det < 0:
        raise InvalidInput(f"max_det must be a non-negative integer, got {max_det!r}")
    return int(max_det)


def _scores(scores: object, n: int) -> np.ndarray:
    s = _array("scores", scores)
    if s.dtype != np.float32:
        raise InvalidInput(f"scores must be float32, got {s.dtype}")
    if s.shape != (n,):
        raise InvalidInput(f"scores must have shape ({n},), got {s.shape}")
    _contiguous("scores", s)
    if n and not np.isfinite(s).all():
        raise InvalidInput("scores contain NaN or infinity")
    return s


def _class_ids(class_ids: object, n: int) -> np.ndarray | None:
    if class_ids is None:
        return None
    c = _array("class_ids", class_ids)
    if c.dtype.kind not in "iu":
        raise InvalidInput(f"class_ids must be integers, got {c.dtype}")
    if c.shape != (n,):
        raise InvalidInput(f"class_ids must have shape ({n},), got {c.shape}")
    _contiguous("class_ids", c)
    if n and (c.min() < np.iinfo(np.int32).min or c.max() > np.iinfo(np.int32).max):
        raise InvalidInput("class_ids must fit in int32")
    return c.astype(np.int32, copy=False)


def nms_args(
    boxes: object,
    scores: object,
    iou_threshold: object,
    score_threshold: object,
    class_ids: object,
    max_det: object,
) -> NmsArgs:
    b = _array("boxes", boxes)
    if b.dtype != np.float32:
        raise InvalidInput(f"boxes must be float32, got {b.dtype}")
    if b.ndim != 2 or b.shape[1] != 4:
        raise InvalidInput(f"boxes must have shape (N, 4) xyxy, got {b.shape}")
    _contiguous("boxes", b)
    n = b.shape[0]
    if n and not np.isfinite(b).all():
        raise InvalidInput("boxes contain NaN or infinity")
    return NmsArgs(
        b,
        _scores(scores, n),
        _class_ids(class_ids, n),
        _threshold("iou_threshold", iou_threshold),
        _threshold("score_threshold", score_threshold),
        _max_det(max_det),
    )


@dataclass(frozen=True)
class KeypointNmsArgs:
    keypoints: np.ndarray
    scores: np.ndarray
    areas: np.ndarray
    sigmas: np.ndarray
    oks_threshold: float
    score_threshold: float
    max_det: int


# COCO's per-keypoint sigmas for the 17-point human skeleton.
COCO_SIGMAS = (
    np.array([26, 25, 25, 35, 35, 79, 79, 72, 72, 62, 62, 107, 107, 87, 87, 89, 89], np.float64)
    / 1000.0
)


def keypoint_nms_args(
    keypoints: object,
    scores: object,
    oks_threshold: object,
    score_threshold: object,
    boxes: object,
    sigmas: object,
    max_det: object,
) -> KeypointNmsArgs:
    kp = _array("keypoints", keypoints)
    if kp.dtype != np.float32:
        raise InvalidInput(f"keypoints must be float32, got {kp.dtype}")
    if kp.ndim != 3 or kp.shape[2] != 3 or kp.shape[1] < 1:
        raise InvalidInput(f"keypoints must have shape (N, K, 3) x/y/visibility, got {kp.shape}")
    _contiguous("keypoints", kp)
    n, k = kp.shape[:2]
    if n and not np.isfinite(kp).all():
        raise InvalidInput("keypoints contain NaN or infinity")
    if sigmas is None:
        sig = COCO_SIGMAS if k == 17 else np.full(k, 0.1)
    else:
        sig = np.asarray(sigmas, dtype=np.float64)
        if sig.shape != (k,) or not np.isfinite(sig).all() or (sig <= 0).any():
            raise InvalidInput(f"sigmas must be {k} positive numbers")
    if boxes is None:
        areas = _keypoint_areas(kp)
    else:
        b = _array("boxes", boxes)
        if b.dtype != np.float32 or b.shape != (n, 4):
            raise InvalidInput(f"boxes must be float32 of shape ({n}, 4), got {b.dtype} {b.shape}")
        if n and not np.isfinite(b).all():
            raise InvalidInput("boxes contain NaN or infinity")
        b64 = b.astype(np.float64)
        areas = np.maximum(b64[:, 2] - b64[:, 0], 0) * np.maximum(b64[:, 3] - b64[:, 1], 0)
    return KeypointNmsArgs(
        kp,
        _scores(scores, n),
        np.ascontiguousarray(areas, dtype=np.float64),
        np.ascontiguousarray(sig, dtype=np.float64),
        _threshold("oks_threshold", oks_threshold),
        _threshold("score_threshold", score_threshold),
        _max_det(max_det),
    )


def _keypoint_areas(kp: np.ndarray) -> np.ndarray:
    """Area of the box around each pose's visible keypoints (0 where none is visible)."""
    vis = kp[:, :, 2] > 0
    x = kp[:, :, 0].astype(np.float64)
    y = kp[:, :, 1].astype(np.float64)
    inf = np.inf  # no visible point: -inf - inf = -inf, clipped to a zero extent below
    w = np.where(vis, x, -inf).max(axis=1, initial=-inf) - np.where(vis, x, inf).min(
        axis=1, initial=inf
    )
    h = np.where(vis, y, -inf).max(axis=1, initial=-inf) - np.where(vis, y, inf).min(
        axis=1, initial=inf
    )
    return np.maximum(w, 0) * np.maximum(h, 0)


MAX_COORD = 1e6  # quad corners beyond this (frame pixels) are nonsense, not geometry


@dataclass(frozen=True)
class LineArgs:
    """quads_to_tensor's checked arguments and the plan every backend samples by."""

    hw: tuple[int, int]  # the frame's (height, width)
    homographies: np.ndarray  # (N, 9) float64: slot pixel -> frame pixel
    taps: np.ndarray  # (N, 2) int32: kx, ky
    widths: np.ndarray  # (N,) int32
    slots: np.ndarray  # (N,) int32
    out: np.ndarray  # (B, 3, h, W) float32
    scale: tuple[float, float, float]  # per R, G, B: out = level * scale + bias
    bias: tuple[float, float, float]
    fill: float  # the (normalised) value right of each line
    bgr_out: bool


def line_args(
    hw: tuple[int, int],
    quads: object,
    widths: object,
    slots: object,
    out: object,
    mean: Sequence[float],
    std: Sequence[float],
    fill: object,
    channels: object,
) -> LineArgs:
    """Validate a quads_to_tensor call on a checked (h, w) frame and plan it (the
    geometry: edgefleet.shared.kernels.lines)."""
    from edgefleet.shared.kernels import lines

    bgr_out = channel_order(channels)
    o = _array("out", out)
    if o.dtype != np.float32 or o.ndim != 4 or o.shape[1] != 3 or 0 in o.shape:
        raise InvalidInput(f"out must be float32 (B, 3, h, W), got {o.dtype} {o.shape}")
    _contiguous("out", o)
    if not o.flags.writeable:
        raise InvalidInput("out is read-only")
    q = _array("quads", quads)
    if q.dtype != np.float32 or q.ndim != 3 or q.shape[1:] != (4, 2):
        raise InvalidInput(
            f"quads must be float32 (N, 4, 2) tl, tr, br, bl, got {q.dtype} {q.shape}"
        )
    n = q.shape[0]
    if n and not (np.isfinite(q).all() and np.abs(q).max() <= MAX_COORD):
        raise InvalidInput(f"quads must be finite frame coordinates (|x| <= {MAX_COORD:g})")
    w = _indices("widths", widths, n, 1, o.shape[3])
    s = _indices("slots", slots, n, 0, o.shape[0] - 1)
    if len(np.unique(s)) != n:
        raise InvalidInput("slots must be distinct: one quad per slot")
    norm = normalise(mean, std, 0)
    fill_f = _threshold("fill", fill)
    hom, taps, degenerate = lines.plan(q, w, o.shape[2])
    if degenerate.any():
        bad = np.flatnonzero(degenerate)[:5].tolist()
        raise InvalidInput(f"quads {bad} are not convex (three corners on a line?)")
    (m0, m1, m2), (s0, s1, s2) = norm.mean, norm.std
    scale = (1.0 / (255.0 * s0), 1.0 / (255.0 * s1), 1.0 / (255.0 * s2))
    bias = (-m0 / s0, -m1 / s1, -m2 / s2)
    return LineArgs(hw, hom, taps, w, s, o, scale, bias, fill_f, bgr_out)


def _indices(name: str, value: object, n: int, lo: int, hi: int) -> np.ndarray:
    """n integers in lo..hi as a contiguous int32 array."""
    arr = np.asarray(value) if isinstance(value, (np.ndarray, list, tuple)) else None
    if arr is None or arr.shape != (n,) or (n and arr.dtype.kind not in "iu"):
        raise InvalidInput(f"{name} must hold one integer per quad ({n}), got {value!r}")
    if n and (arr.min() < lo or arr.max() > hi):
        raise InvalidInput(f"{name} must lie in {lo}..{hi}")
    return np.ascontiguousarray(arr, dtype=np.int32)
