"""quads_to_tensor's geometry: text-line quads of one frame, each rectified into a slot.

A quad is (tl, tr, br, bl) in frame pixels, pixel centres on integer coordinates. Its line
is `length x thickness` source pixels (the longer of each pair of opposite sides, rounded,
at least 1); a line at least 1.5x taller than wide is read turned a quarter anti-clockwise
(its tr corner becomes the slot's top left), as PP-OCR reads vertical text.

Slot i's first widths[i] columns hold the line: the homography H_i maps the rectangle
[0, widths[i]] x [0, h] of the slot (pixel (x, y) covers [x, x+1] x [y, y+1]) onto the
quad, and each output pixel is the mean of kx x ky bilinear taps spread evenly over its
square (replicating the frame's border). k = 1 (one tap at the centre) where the line is
not shrunk by more than MIN_SUPERSAMPLE along that axis, else ceil(shrink) up to
MAX_TAPS: an area filter, so big text read at 48 px does not alias. One definition here
for every backend: they get H and (kx, ky) per quad and only sample.
"""

from __future__ import annotations

import numpy as np

# Shrink factor above which one bilinear tap aliases: a tap already averages over +-1 source
# pixel, enough up to 2x. Between 1.5x and 2x, four taps cost more time (bench kernels'
# 16 lines) and read no better (seed 5000's easy stills).
MIN_SUPERSAMPLE = 2.0
MAX_TAPS = 8  # per axis: a line shrunk more than 8x is averaged over 8 x 8 taps
TURN_RATIO = 1.5  # thickness / length at which a line is read turned


def line_sizes(quads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(length, thickness) in source pixels of each (N, 4, 2) quad as read, and whether it
    can be read (a convex quad: no three corners on a line)."""
    sizes, _ = _sizes(quads)
    _, degenerate = _square_to_quad(quads.astype(np.float64))
    return sizes, ~degenerate


def _sizes(quads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(length, thickness) as read, and whether each line is turned."""
    q = quads.astype(np.float64)
    w = np.maximum(_side(q, 0, 1), _side(q, 3, 2))
    h = np.maximum(_side(q, 0, 3), _side(q, 1, 2))
    w = np.maximum(1, np.round(w)).astype(np.int64)
    h = np.maximum(1, np.round(h)).astype(np.int64)
    turned = h >= TURN_RATIO * w
    sizes = np.stack([np.where(turned, h, w), np.where(turned, w, h)], axis=1)
    return sizes, turned


def _side(q: np.ndarray, a: int, b: int) -> np.ndarray:
    return np.hypot(q[:, a, 0] - q[:, b, 0], q[:, a, 1] - q[:, b, 1])


def plan(
    quads: np.ndarray, widths: np.ndarray, height: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per quad: the (N, 9) float64 homography slot -> frame, the (N, 2) int32 taps
    (kx, ky), and which quads are degenerate (not convex: no homography)."""
    sizes, turned = _sizes(quads)
    q = quads.astype(np.float64)
    q = np.where(turned[:, None, None], np.roll(q, -1, axis=1), q)  # tr becomes the top left
    hsq, degenerate = _square_to_quad(q)
    w = widths.astype(np.float64)
    scale = np.zeros((len(q), 3, 3))
    scale[:, 0, 0] = 1.0 / w
    scale[:, 1, 1] = 1.0 / height
    scale[:, 2, 2] = 1.0
    hom = (hsq @ scale).reshape(-1, 9)
    taps = np.stack([_taps(sizes[:, 0] / w), _taps(sizes[:, 1] / height)], axis=1)
    return np.ascontiguousarray(hom), taps.astype(np.int32), degenerate


def _taps(shrink: np.ndarray) -> np.ndarray:
    k = np.minimum(np.ceil(shrink), MAX_TAPS)
    return np.where(shrink > MIN_SUPERSAMPLE, k, 1)


def _square_to_quad(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Homographies mapping the unit square's (0,0), (1,0), (1,1), (0,1) onto each quad's
    corners (Heckbert's closed form), and which quads have none: three corners on a line,
    or not convex (the projective denominator, affine in the square, must stay > 0)."""
    x0, x1, x2, x3 = (q[:, i, 0] for i in range(4))
    y0, y1, y2, y3 = (q[:, i, 1] for i in range(4))
    dx1, dx2, dx3 = x1 - x2, x3 - x2, x0 - x1 + x2 - x3
    dy1, dy2, dy3 = y1 - y2, y3 - y2, y0 - y1 + y2 - y3
    den = dx1 * dy2 - dx2 * dy1
    degenerate = ~(np.abs(den) > 1e-9 * (np.abs(dx1 * dy2) + np.abs(dx2 * dy1)) + 1e-300)
    safe = np.where(degenerate, 1.0, den)
    g = np.where(degenerate, 0.0, (dx3 * dy2 - dx2 * dy3) / safe)
    h = np.where(degenerate, 0.0, (dx1 * dy3 - dx3 * dy1) / safe)
    m = np.empty((len(q), 3, 3))
    m[:, 0] = np.stack([x1 - x0 + g * x1, x3 - x0 + h * x3, x0], axis=1)
    m[:, 1] = np.stack([y1 - y0 + g * y1, y3 - y0 + h * y3, y0], axis=1)
    m[:, 2] = np.stack([g, h, np.ones_like(g)], axis=1)
    positive = np.minimum(np.minimum(1 + g, 1 + h), 1 + g + h) > 1e-9
    finite = np.isfinite(m).all(axis=(1, 2))
    return m, degenerate | ~positive | ~finite
