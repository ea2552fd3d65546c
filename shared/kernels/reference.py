"""The numpy/OpenCV reference: it defines what correct output is for every kernel.

Pre-processing is exactly the chain a user writes with OpenCV: colour conversion
(BT.601 as `cv2.COLOR_YUV2RGB_NV12`), `cv2.resize` with `INTER_LINEAR` to the letterbox
size, a `pad`-valued canvas, `(x / 255 - mean) / std`, NCHW. NMS is greedy and defines
the tie-break and the arithmetic the native and CUDA kernels reproduce bit for bit:
candidates are those with `score >= score_threshold`, visited by score (higher first)
then index (lower first); a candidate is dropped when a kept box of the same class has
`inter > iou_threshold * union`, all in float32 (inter and union as computed below).
"""

from __future__ import annotations

import cv2
import numpy as np

from edgefleet.shared.imaging.letterbox import LetterboxTransform
from edgefleet.shared.kernels import checks

_CVT = {
    "nv12": cv2.COLOR_YUV2RGB_NV12,
    "i420": cv2.COLOR_YUV2RGB_I420,
    "bgr": cv2.COLOR_BGR2RGB,
}
OKS_EPS = float(np.spacing(1))


def to_rgb(frame: np.ndarray, fmt: str) -> np.ndarray:
    """The frame as an (H, W, 3) uint8 RGB image."""
    if fmt == "rgb":
        return frame
    return cv2.cvtColor(frame, _CVT[fmt])


def letterbox_normalise(
    rgb: np.ndarray,
    size: tuple[int, int],
    norm: checks.Normalise,
    dtype: np.dtype,
    out: np.ndarray | None = None,
    bgr_out: bool = False,
    stretch: bool = False,
) -> tuple[np.ndarray, LetterboxTransform]:
    t = (LetterboxTransform.stretch if stretch else LetterboxTransform.plan)(rgb.shape[:2], size)
    resized = cv2.resize(rgb, (t.new_w, t.new_h), interpolation=cv2.INTER_LINEAR)
    canvas = np.full((t.dst_h, t.dst_w, 3), norm.pad, np.uint8)
    canvas[t.pad_top : t.pad_top + t.new_h, t.pad_left : t.pad_left + t.new_w] = resized
    mean = np.asarray(norm.mean, np.float32)
    std = np.asarray(norm.std, np.float32)
    x = (canvas.astype(np.float32) / np.float32(255.0) - mean) / std
    planes = x.transpose(2, 0, 1)
    tensor = np.ascontiguousarray((planes[::-1] if bgr_out else planes)[None], dtype=dtype)
    if out is not None:
        out[...] = tensor
        tensor = out
    return tensor, t


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
) -> tuple[np.ndarray, LetterboxTransform]:
    """Reference pre-processing of a frame in `fmt` (nv12, i420, bgr, rgb); `channels`
    says the planes' order out ('rgb', or 'bgr' for models trained on OpenCV's order)."""
    checks.frame_hw(frame, fmt)
    swap = checks.channel_order(channels)
    hw, norm, dt = checks.tensor_args(size, mean, std, pad, dtype)
    buf = None if out is None else checks.out_buffer(out, hw, dt)
    return letterbox_normalise(to_rgb(frame, fmt), hw, norm, dt, buf, swap, stretch)


def nms(
    boxes: np.ndarray,
    scores: np.ndarray,
    iou_threshold: float,
    score_threshold: float = 0.0,
    class_ids: np.ndarray | None = None,
    max_det: int = 300,
) -> np.ndarray:
    """Greedy NMS; the kept indices, highest score first (ties: lower index first)."""
    a = checks.nms_args(boxes, scores, iou_threshold, score_threshold, class_ids, max_det)
    order = _order(a.scores, a.score_threshold)
    b = a.boxes
    thr = np.float32(a.iou_threshold)
    zero = np.float32(0)
    areas = np.maximum(b[:, 2] - b[:, 0], zero) * np.maximum(b[:, 3] - b[:, 1], zero)
    kept: list[int] = []
    for i in order:
        if len(kept) >= a.max_det:
            break
        if kept:
            k = np.asarray(kept)
            w = np.maximum(np.minimum(b[k, 2], b[i, 2]) - np.maximum(b[k, 0], b[i, 0]), zero)
            h = np.maximum(np.minimum(b[k, 3], b[i, 3]) - np.maximum(b[k, 1], b[i, 1]), zero)
            inter = w * h
            union = (areas[k] + areas[i]) - inter
            hit = inter > thr * union
            if a.class_ids is not None:
                hit &= a.class_ids[k] == a.class_ids[i]
            if hit.any():
                continue
        kept.append(int(i))
    return np.asarray(kept, dtype=np.int64)


def _order(scores: np.ndarray, score_threshold: float) -> np.ndarray:
    cand = np.flatnonzero(scores >= np.float32(score_threshold))
    return cand[np.argsort(-scores[cand], kind="stable")]


def keypoint_nms(
    keypoints: np.ndarray,
    scores: np.ndarray,
    oks_threshold: float = 0.5,
    score_threshold: float = 0.0,
    boxes: np.ndarray | None = None,
    sigmas: np.ndarray | None = None,
    max_det: int = 300,
) -> np.ndarray:
    """Greedy pose NMS by object keypoint similarity (COCO OKS), same order as `nms`.

    OKS(kept, cand) = mean over the kept pose's visible keypoints (v > 0) of
    exp(-d^2 / (2 sigma)^2 / (area + eps) / 2), with the kept pose's area (its box, or the
    box around its visible keypoints); a candidate is dropped when OKS > oks_threshold.
    """
    a = checks.keypoint_nms_args(
        keypoints, scores, oks_threshold, score_threshold, boxes, sigmas, max_det
    )
    kp = a.keypoints.astype(np.float64)
    var = (2.0 * a.sigmas) ** 2
    kept: list[int] = []
    for i in _order(a.scores, a.score_threshold):
        if len(kept) >= a.max_det:
            break
        suppressed = False
        for k in kept:
            vis = a.keypoints[k, :, 2] > 0
            nvis = int(vis.sum())
            if nvis == 0:
                continue
            d2 = (kp[k, :, 0] - kp[i, :, 0]) ** 2 + (kp[k, :, 1] - kp[i, :, 1]) ** 2
            e = d2 / var / (a.areas[k] + OKS_EPS) / 2.0
            if float(np.exp(-e)[vis].sum()) / nvis > a.oks_threshold:
                suppressed = True
                break
        if not suppressed:
            kept.append(int(i))
    return np.asarray(kept, dtype=np.int64)


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
) -> np.ndarray:
    """Reference line sampling (edgefleet.shared.kernels.lines), float64 throughout; of a
    YUV frame only the pixels each line's taps reach are converted."""
    hw = checks.frame_hw(frame, fmt)
    a = checks.line_args(hw, quads, widths, slots, out, mean, std, fill, channels)
    h = a.out.shape[2]
    for hom, (kx, ky), w, slot in zip(a.homographies, a.taps, a.widths, a.slots, strict=True):
        level = _sample_line(frame, fmt, a.hw, hom.reshape(3, 3), int(w), h, int(kx), int(ky))
        x = level * np.asarray(a.scale) + np.asarray(a.bias)  # (h, w, 3), R, G, B
        planes = x.transpose(2, 0, 1)
        a.out[slot, :, :, :w] = planes[::-1] if a.bgr_out else planes
        a.out[slot, :, :, w:] = a.fill
    return a.out


def _sample_line(
    frame: np.ndarray,
    fmt: str,
    hw: tuple[int, int],
    hom: np.ndarray,
    w: int,
    h: int,
    kx: int,
    ky: int,
) -> np.ndarray:
    """(h, w, 3) float64 levels: the mean of kx x ky bilinear taps per output pixel."""
    from edgefleet.shared.kernels.crops import crop_windows, sub_frame

    px = (np.arange(w)[:, None] + (np.arange(kx) + 0.5) / kx)[None, None]  # (1, 1, w, kx)
    py = (np.arange(h)[:, None] + (np.arange(ky) + 0.5) / ky)[:, :, None, None]  # (h, ky, 1, 1)
    den = hom[2, 0] * px + hom[2, 1] * py + hom[2, 2]
    sx = (hom[0, 0] * px + hom[0, 1] * py + hom[0, 2]) / den
    sy = (hom[1, 0] * px + hom[1, 1] * py + hom[1, 2]) / den
    fh, fw = hw
    sx = np.clip(sx, -1.0, float(fw))
    sy = np.clip(sy, -1.0, float(fh))
    x0, y0 = np.floor(sx), np.floor(sy)
    fx, fy = (sx - x0)[..., None], (sy - y0)[..., None]
    xa, xb = np.clip(x0, 0, fw - 1).astype(np.int64), np.clip(x0 + 1, 0, fw - 1).astype(np.int64)
    ya, yb = np.clip(y0, 0, fh - 1).astype(np.int64), np.clip(y0 + 1, 0, fh - 1).astype(np.int64)
    box = np.array([[xa.min(), ya.min(), xb.max() + 1, yb.max() + 1]], np.float32)
    wx0, wy0, wx1, wy1 = crop_windows(box, hw, fmt)[0]
    rgb = to_rgb(sub_frame(frame, fmt, hw, (wx0, wy0, wx1, wy1)), fmt).astype(np.float64)
    xa, xb, ya, yb = xa - wx0, xb - wx0, ya - wy0, yb - wy0
    top = rgb[ya, xa] * (1 - fx) + rgb[ya, xb] * fx
    bottom = rgb[yb, xa] * (1 - fx) + rgb[yb, xb] * fx
    taps = top * (1 - fy) + bottom * fy  # (h, ky, w, kx, 3)
    return taps.mean(axis=(1, 3))
