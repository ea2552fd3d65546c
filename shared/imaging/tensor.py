"""Normalise and lay out for the model, plus the numpy/OpenCV reference of the whole chain.

`preprocess_reference` DEFINES correct pre-processing output: the CUDA and NEON kernels
in `shared/kernels/` are compared against it with stated tolerances. Arithmetic is
float32 in exactly this order: x / 255, minus mean, divided by std (mean and std are
in the 0-1 scale, e.g. ImageNet's (0.485, 0.456, 0.406)); float16 output is the float32
result rounded once at the end.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgefleet.shared.errors import InvalidInput
from edgefleet.shared.imaging.colour import nv12_to_rgb
from edgefleet.shared.imaging.letterbox import LetterboxTransform, letterbox

_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


def _per_channel(name: str, values: Sequence[float]) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float32).reshape(-1)
    if arr.shape != (3,) or not np.all(np.isfinite(arr)):
        raise InvalidInput(f"{name} must be three finite numbers, got {values!r}")
    return arr.reshape(3, 1, 1)


def to_tensor(
    canvas: np.ndarray,
    mean: Sequence[float] = (0.0, 0.0, 0.0),
    std: Sequence[float] = (1.0, 1.0, 1.0),
    dtype: type | np.dtype = np.float32,
) -> np.ndarray:
    """RGB uint8 HxWx3 -> (1, 3, H, W) C-contiguous `(x / 255 - mean) / std`."""
    arr = np.asarray(canvas)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3 or arr.size == 0:
        raise InvalidInput(f"to_tensor needs RGB uint8 HxWx3, got {arr.dtype} {arr.shape}")
    out_dtype = np.dtype(dtype)
    if out_dtype not in _DTYPES:
        raise InvalidInput(f"to_tensor dtype must be float32 or float16, got {out_dtype}")
    m = _per_channel("mean", mean)
    s = _per_channel("std", std)
    if np.any(s == 0):
        raise InvalidInput(f"std must not contain zero, got {std!r}")
    chw = arr.transpose(2, 0, 1).astype(np.float32, order="C")  # one pass: layout change + widen
    chw /= np.float32(255.0)
    chw -= m
    chw /= s
    out = chw if out_dtype == np.float32 else chw.astype(np.float16)
    return out[np.newaxis]


def preprocess_reference(
    frame_nv12: np.ndarray,
    size: tuple[int, int],
    mean: Sequence[float] = (0.0, 0.0, 0.0),
    std: Sequence[float] = (1.0, 1.0, 1.0),
    pad: int = 114,
    dtype: type | np.dtype = np.float32,
) -> tuple[np.ndarray, LetterboxTransform]:
    """NV12 (H*3/2, W) -> RGB -> letterbox to `size` (h, w) -> normalise -> (1, 3, h, w)."""
    frame = np.asarray(frame_nv12)
    if frame.ndim != 2 or frame.shape[0] % 3:
        raise InvalidInput(
            f"preprocess_reference needs an NV12 frame shaped (H*3/2, W), got {frame.shape}"
        )
    height, width = frame.shape[0] * 2 // 3, frame.shape[1]
    rgb = nv12_to_rgb(frame, width, height)
    canvas, transform = letterbox(rgb, size, pad)
    return to_tensor(canvas, mean, std, dtype), transform
