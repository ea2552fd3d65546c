"""Fused pre-processing and NMS kernels: CUDA, native C (NEON or portable), reference.

One interface whatever runs underneath. The backend is chosen once, on first use, by a
chain of availability filters (CUDA -> native C -> numpy/OpenCV reference); the winner
and the reason each other candidate was passed over are logged, and `backend()` says
which is active. `use_backend()` forces one (tests, benchmarks, debugging).
"""

from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass
from types import ModuleType

import numpy as np
from prometheus_client import Gauge

from edgefleet.shared.errors import InvalidInput
from edgefleet.shared.imaging.letterbox import LetterboxTransform
from edgefleet.shared.kernels import checks

__all__ = [
    "BackendChoice",
    "backend",
    "bgr_to_tensor",
    "choose_backend",
    "crop_resize",
    "frame_to_tensor",
    "i420_to_tensor",
    "keypoint_nms",
    "line_sizes",
    "nms",
    "nv12_to_tensor",
    "quads_to_tensor",
    "rgb_to_tensor",
    "to_rgb",
    "use_backend",
]

logger = logging.getLogger(__name__)
BACKENDS = ("cuda", "native", "reference")
BACKEND_ACTIVE = Gauge(
    "ef_kernels_backend", "1 for the active kernel backend, 0 for the others", ["backend"]
)


@dataclass(frozen=True)
class BackendChoice:
    """The active backend's name, its module, and why the others were passed over."""

    name: str
    module: ModuleType
    rejected: tuple[tuple[str, str], ...]


def _probe(candidate: str) -> tuple[ModuleType | None, str]:
    """Import one backend; (module, '') or (None, why not)."""
    try:
        if candidate == "cuda":
            mod = importlib.import_module("edgefleet.shared.kernels.cuda_backend")
            ok, why = mod.available()
            return (mod, "") if ok else (None, why)
        if candidate == "native":
            return importlib.import_module("edgefleet.shared.kernels.native"), ""
        return importlib.import_module("edgefleet.shared.kernels.reference"), ""
    except ImportError as exc:  # extension not built, pycuda missing, ...
        return None, f"{type(exc).__name__}: {exc}"


def choose_backend(order: tuple[str, ...] = BACKENDS) -> BackendChoice:
    """The first available backend in `order`, with the reasons for skipping the others."""
    rejected: list[tuple[str, str]] = []
    for candidate in order:
        mod, why = _probe(candidate)
        if mod is None:
            rejected.append((candidate, why))
            continue
        name = mod.name() if candidate == "native" else candidate
        return BackendChoice(name, mod, tuple(rejected))
    raise InvalidInput(f"no kernel backend available: {rejected}")


_lock = threading.Lock()
_choice: BackendChoice | None = None


def _active() -> BackendChoice:
    global _choice
    if _choice is None:
        with _lock:
            if _choice is None:
                choice = choose_backend()
                logger.info(
                    "kernels backend %s",
                    choice.name,
                    extra={"backend": choice.name, "rejected": dict(choice.rejected)},
                )
                for cand, why in choice.rejected:
                    logger.info("kernels backend %s not used: %s", cand, why)
                _set_choice(choice)
    assert _choice is not None  # set above
    return _choice


def use_backend(name: str | None) -> str:
    """Force 'cuda', 'native' or 'reference' (None: choose again); returns the active name."""
    global _choice
    if name is not None and name not in BACKENDS:
        raise InvalidInput(f"unknown kernel backend {name!r}; one of {BACKENDS}")
    with _lock:
        if name is None:
            _choice = None
        else:
            _set_choice(choose_backend((name,)))
    return backend()


def _set_choice(choice: BackendChoice) -> None:
    global _choice
    _choice = choice
    for name in ("cuda", "neon", "c", "reference"):
        BACKEND_ACTIVE.labels(name).set(1 if name == choice.name else 0)


def backend() -> str:
    """Which implementation is active: 'cuda', 'neon', 'c' or 'reference'."""
    return _active().name


def frame_to_tensor(
    frame,
    fmt,
    size,
    mean=(0.0, 0.0, 0.0),
    std=(1.0, 1.0, 1.0),
    pad=114,
    dtype=np.float32,
    out=None,
    channels="rgb",
    stretch=False,
) -> tuple[np.ndarray, LetterboxTransform]:
    """A frame in its native `fmt` (nv12, i420, bgr, rgb) -> (1, 3, h, w) tensor in one pass.

    Scaled by min(h/H, w/W) with bilinear (cv2 INTER_LINEAR) sampling, centred on a
    `pad`-valued canvas (with `stretch`, each axis scaled to fill the canvas: no pad),
    normalised as (x / 255 - mean) / std with mean/std per R, G, B;
    the planes go out in `channels` order ('bgr' for models trained on OpenCV's order);
    written into `out` if given.
    """
    if fmt not in checks.FORMATS:  # before any backend indexes its tables with it
        raise InvalidInput(f"unknown frame format {fmt!r}; one of {checks.FORMATS}")
    return _active().module.frame_to_tensor(
        frame, fmt, size, mean, std, pad, dtype, out, channels, stretch
    )


def to_rgb(frame, fmt) -> np.ndarray:
    """A (small) frame in `fmt` as packed RGB, by the reference's definition: for crops of
    YUV frames that a warp must read; whole frames go through `frame_to_tensor`."""
    from edgefleet.shared.kernels.reference import to_rgb as convert

    checks.frame_hw(frame, fmt)
    return convert(frame, fmt)


def nv12_to_tensor(
    frame, size, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), pad=114, dtype=np.float32, out=None
) -> tuple[np.ndarray, LetterboxTransform]:
    """`frame_to_tensor` of an NV12 frame (H*3/2, W) uint8, RGB planes out."""
    return frame_to_tensor(frame, "nv12", size, mean, std, pad, dtype, out)


def i420_to_tensor(
    frame, size, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), pad=114, dtype=np.float32, out=None
) -> tuple[np.ndarray, LetterboxTransform]:
    """As `nv12_to_tensor` for planar I420 (Y, then U, then V) frames."""
    return frame_to_tensor(frame, "i420", size, mean, std, pad, dtype, out)


def bgr_to_tensor(
    frame, size, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), pad=114, dtype=np.float32, out=None
) -> tuple[np.ndarray, LetterboxTransform]:
    """As `nv12_to_tensor` for packed (H, W, 3) BGR frames (OpenCV's order); RGB out."""
    return frame_to_tensor(frame, "bgr", size, mean, std, pad, dtype, out)


def rgb_to_tensor(
    frame, size, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), pad=114, dtype=np.float32, out=None
) -> tuple[np.ndarray, LetterboxTransform]:
    """As `nv12_to_tensor` for packed (H, W, 3) RGB frames."""
    return frame_to_tensor(frame, "rgb", size, mean, std, pad, dtype, out)


def crop_resize(
    frame,
    boxes,
    size,
    fmt="nv12",
    mean=(0.0, 0.0, 0.0),
    std=(1.0, 1.0, 1.0),
    pad=114,
    dtype=np.float32,
    out=None,
):
    """Crop each float32 xyxy box of `frame` and letterbox it into an (N, 3, h, w) batch.

    Returns (batch, placements); `placements[i].boxes_to_frame` maps slot i's model
    coordinates back to frame pixels. Crops are cut on whole (even, for 4:2:0) pixels.
    """
    from edgefleet.shared.kernels.crops import crop_resize as run

    module = _active().module
    return run(module.frame_to_tensor, frame, fmt, boxes, size, mean, std, pad, dtype, out)


def quads_to_tensor(
    frame,
    fmt,
    quads,
    widths,
    slots,
    out,
    mean=(0.0, 0.0, 0.0),
    std=(1.0, 1.0, 1.0),
    fill=0.0,
    channels="rgb",
) -> np.ndarray:
    """Text lines of one frame, rectified straight into slots of a float32 (B, 3, h, W) batch.

    quads: float32 (N, 4, 2) tl, tr, br, bl in frame pixels; line i fills the first
    widths[i] columns of out[slots[i]] (colour-converted from `fmt`, normalised as
    (x / 255 - mean) / std per R, G, B, planes in `channels` order) and `fill` the rest.
    A line 1.5x taller than wide is read turned; lines shrunk more than 2x are
    supersampled (an area filter). The geometry: edgefleet.shared.kernels.lines.
    """
    if fmt not in checks.FORMATS:
        raise InvalidInput(f"unknown frame format {fmt!r}; one of {checks.FORMATS}")
    module = _active().module
    return module.quads_to_tensor(frame, fmt, quads, widths, slots, out, mean, std, fill, channels)


def line_sizes(quads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(length, thickness) of each float32 (N, 4, 2) quad's line as `quads_to_tensor` reads
    it (vertical lines turned), and whether it can be read at all (a convex quad)."""
    from edgefleet.shared.kernels.lines import line_sizes as sizes

    try:
        q = np.asarray(quads, np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"quads must be numbers of shape (N, 4, 2): {exc}") from exc
    if q.ndim != 3 or q.shape[1:] != (4, 2):
        raise InvalidInput(f"quads must have shape (N, 4, 2) tl, tr, br, bl, got {q.shape}")
    if q.size and not np.isfinite(q).all():
        raise InvalidInput("quads contain NaN or infinity")
    return sizes(q)


def nms(
    boxes, scores, iou_threshold, score_threshold=0.0, class_ids=None, max_det=300
) -> np.ndarray:
    """Greedy class-aware NMS; kept indices (int64), highest score first, ties by index.

    `boxes` float32 (N, 4) xyxy, `scores` float32 (N,); candidates need
    score >= score_threshold; a box is dropped when a kept box of its class has
    IoU > iou_threshold. Boxes of different `class_ids` never suppress each other.
    """
    return _active().module.nms(boxes, scores, iou_threshold, score_threshold, class_ids, max_det)


def keypoint_nms(
    keypoints,
    scores,
    oks_threshold=0.5,
    score_threshold=0.0,
    boxes=None,
    sigmas=None,
    max_det=300,
) -> np.ndarray:
    """Greedy pose NMS by OKS; `keypoints` float32 (N, K, 3) x/y/visibility.

    `sigmas` default to COCO's for K=17 (0.1 each otherwise); the pose scale is the
    area of `boxes` when given, else of the box around the visible keypoints.
    """
    return _active().module.keypoint_nms(
        keypoints, scores, oks_threshold, score_threshold, boxes, sigmas, max_det
    )
