"""Camera pixel formats -> RGB uint8, with buffer lengths checked against the stated size.

The conversion is OpenCV's BT.601 "video range" YUV -> RGB (what `COLOR_YUV2RGB_NV12`
does), in 20-bit fixed point; `yuv_to_rgb_bt601` spells it out in numpy so CUDA/NEON
kernels can match it bit for bit:

    y' = max(Y - 16, 0) * 1220542          u' = U - 128, v' = V - 128
    R = clip((y' + 1673527 v' + 2^19) >> 20)
    G = clip((y' - 852492 v' - 409993 u' + 2^19) >> 20)
    B = clip((y' + 2116026 u' + 2^19) >> 20)

4:2:0 chroma is nearest-neighbour: pixel (r, c) takes the chroma sample (r // 2, c // 2).
"""

from __future__ import annotations

import cv2
import numpy as np

from edgefleet.shared.errors import InvalidInput

BT601_CY = 1220542
BT601_CVR = 1673527
BT601_CVG = -852492
BT601_CUG = -409993
BT601_CUB = 2116026
BT601_SHIFT = 20

RawBuffer = bytes | bytearray | memoryview | np.ndarray


def _plane(buf: RawBuffer, what: str, rows: int, width: int, stride: int | None) -> np.ndarray:
    """View `buf` as (rows, width) uint8, checking its length against the size."""
    row_bytes = width if stride is None else stride
    if stride is not None and stride < width:
        raise InvalidInput(f"{what} stride {stride} is smaller than the width {width}")
    arr = np.asarray(buf) if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    if arr.dtype != np.uint8:
        raise InvalidInput(f"{what} buffer must be uint8, got {arr.dtype}")
    expected = rows * row_bytes
    if arr.size != expected:
        raise InvalidInput(
            f"{what} buffer has {arr.size} bytes, but {width}x{rows} with row pitch "
            f"{row_bytes} needs {expected}"
        )
    if arr.ndim > 1 and arr.shape[0] != rows:
        raise InvalidInput(
            f"{what} buffer is shaped {arr.shape}, expected flat or ({rows}, {row_bytes})"
        )
    return arr.reshape(rows, row_bytes)[:, :width]


def _check_size(what: str, width: int, height: int, *, even_height: bool) -> None:
    if width <= 0 or height <= 0:
        raise InvalidInput(f"{what} size must be positive, got {width}x{height}")
    if width % 2 or (even_height and height % 2):
        need = "width and height" if even_height else "width"
        raise InvalidInput(f"{what} needs an even {need}, got {width}x{height}")


def nv12_to_rgb(
    buf: RawBuffer, width: int, height: int, *, stride: int | None = None
) -> np.ndarray:
    """NV12 (Y plane, then interleaved UV at half resolution) -> RGB uint8 HxWx3.

    `buf` is flat or shaped (H*3/2, W); `stride` is the row pitch in bytes when the
    decoder pads rows (Jetson NvBuffer, V4L2), defaulting to the width.
    """
    _check_size("NV12", width, height, even_height=True)
    yuv = _plane(buf, "NV12", height * 3 // 2, width, stride)
    return cv2.cvtColor(yuv, cv2.COLOR_YUV2RGB_NV12)


def i420_to_rgb(
    buf: RawBuffer, width: int, height: int, *, stride: int | None = None
) -> np.ndarray:
    """I420 (Y, then U and V planes at half resolution) -> RGB uint8 HxWx3."""
    _check_size("I420", width, height, even_height=True)
    if stride not in (None, width):
        raise InvalidInput("I420 with a row pitch is not supported: repack the planes")
    yuv = _plane(buf, "I420", height * 3 // 2, width, None)
    return cv2.cvtColor(yuv, cv2.COLOR_YUV2RGB_I420)


def yuyv_to_rgb(
    buf: RawBuffer, width: int, height: int, *, stride: int | None = None
) -> np.ndarray:
    """YUYV / YUY2 (packed 4:2:2, 2 bytes a pixel; USB cameras) -> RGB uint8 HxWx3."""
    _check_size("YUYV", width, height, even_height=False)
    packed = _plane(buf, "YUYV", height, width * 2, stride)
    return cv2.cvtColor(packed.reshape(height, width, 2), cv2.COLOR_YUV2RGB_YUYV)


def bgr_to_rgb(img: np.ndarray) -> np.ndarray:
    """BGR (OpenCV's order) or BGRA -> RGB, a new C-contiguous array."""
    arr = np.asarray(img)
    if arr.ndim != 3 or arr.shape[2] not in (3, 4) or arr.size == 0:
        raise InvalidInput(f"bgr_to_rgb needs an HxWx3 or HxWx4 image, got shape {arr.shape}")
    if arr.dtype not in (np.uint8, np.uint16, np.float32):
        raise InvalidInput(f"bgr_to_rgb needs uint8, uint16 or float32, got {arr.dtype}")
    code = cv2.COLOR_BGR2RGB if arr.shape[2] == 3 else cv2.COLOR_BGRA2RGB
    return cv2.cvtColor(arr, code)


def yuv_to_rgb_bt601(y: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Per-pixel Y, U, V (same shape, uint8) -> RGB uint8, OpenCV's fixed-point BT.601."""
    yy = np.maximum(y.astype(np.int64) - 16, 0) * BT601_CY
    uu = u.astype(np.int64) - 128
    vv = v.astype(np.int64) - 128
    half = 1 << (BT601_SHIFT - 1)
    r = (yy + BT601_CVR * vv + half) >> BT601_SHIFT
    g = (yy + BT601_CVG * vv + BT601_CUG * uu + half) >> BT601_SHIFT
    b = (yy + BT601_CUB * uu + half) >> BT601_SHIFT
    return np.clip(np.stack([r, g, b], axis=-1), 0, 255).astype(np.uint8)


def nv12_to_rgb_formula(buf: RawBuffer, width: int, height: int) -> np.ndarray:
    """The same result as `nv12_to_rgb`, written out in numpy (a reference for kernels)."""
    _check_size("NV12", width, height, even_height=True)
    yuv = _plane(buf, "NV12", height * 3 // 2, width, None)
    y = yuv[:height]
    uv = yuv[height:].reshape(height // 2, width // 2, 2)
    uv_full = uv.repeat(2, axis=0).repeat(2, axis=1)
    return yuv_to_rgb_bt601(y, uv_full[..., 0], uv_full[..., 1])
