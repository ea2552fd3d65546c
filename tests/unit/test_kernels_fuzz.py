"""Property tests over the native entry points: thousands of generated cases.

Shapes from 1-pixel to extreme aspect ratios, odd widths (packed formats), every format
and output dtype; box sets that are empty, all identical, tied in score, degenerate.
The native backend must agree with the reference (pre-processing within one level on
the [0, 1] scale, NMS index for index), and arbitrary junk must raise InvalidInput.
The same tests were run once with the extension built under AddressSanitizer (see
BENCHMARKS.md, kernels section).
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import edgefleet.shared.kernels as kernels
from edgefleet.shared.errors import InvalidInput
from edgefleet.shared.kernels import native, reference

FUZZ = settings(
    max_examples=1500,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TOL = 1.0 / 255.0


@st.composite
def frames(draw):
    fmt = draw(st.sampled_from(["nv12", "i420", "bgr", "rgb"]))
    tall = draw(st.booleans())
    long_side = draw(st.integers(1, 400))
    short_side = draw(st.integers(1, 12))
    h, w = (long_side, short_side) if tall else (short_side, long_side)
    if draw(st.booleans()):
        h, w = draw(st.integers(1, 48)), draw(st.integers(1, 48))
    if fmt in ("nv12", "i420"):
        h, w = max(2, h + h % 2), max(2, w + w % 2)
        shape: tuple[int, ...] = (h * 3 // 2, w)
    else:
        shape = (h, w, 3)
    seed = draw(st.integers(0, 2**32 - 1))
    frame = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    return fmt, frame


@FUZZ
@given(
    case=frames(),
    size=st.tuples(st.integers(1, 96), st.integers(1, 96)),
    mean=st.tuples(*[st.floats(0, 1)] * 3),
    std=st.tuples(*[st.floats(0.1, 2)] * 3),
    pad=st.integers(0, 255),
    f16=st.booleans(),
    threads=st.integers(1, 3),
    portable=st.booleans(),
    channels=st.sampled_from(["rgb", "bgr"]),
)
def test_preprocess_matches_reference(case, size, mean, std, pad, f16, threads, portable, channels):
    fmt, frame = case
    dtype = np.float16 if f16 else np.float32
    impl = native.IMPL_PORTABLE if portable else native.IMPL_AUTO
    got, t = native.frame_to_tensor(
        frame, fmt, size, mean, std, pad, dtype, None, channels, impl=impl, threads=threads
    )
    want, t_ref = reference.frame_to_tensor(frame, fmt, size, mean, std, pad, dtype, None, channels)
    assert t == t_ref
    plane_std = std[::-1] if channels == "bgr" else std  # the planes' order out
    s = np.asarray(plane_std, np.float32)[None, :, None, None]
    diff = np.abs((got.astype(np.float32) - want.astype(np.float32)) * s).max()
    # float16 rounds |x - mean| on the [0, 1] scale to ~2^-11 relative: allow that on top.
    assert diff <= TOL + (1e-3 if f16 else 1e-6)


@st.composite
def box_sets(draw):
    n = draw(st.integers(0, 60))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["random", "grid", "identical", "degenerate"]))
    if kind == "random":
        xy = rng.uniform(-50, 200, (n, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(0, 80, (n, 2))], 1)
    elif kind == "grid":  # few distinct coordinates: many exact ties in IoU
        xy = rng.integers(0, 4, (n, 2)) * 10.0
        boxes = np.concatenate([xy, xy + rng.integers(1, 4, (n, 2)) * 10.0], 1)
    elif kind == "identical":
        boxes = np.tile([[5.0, 5.0, 25.0, 45.0]], (n, 1))
    else:  # zero-width, zero-height and inverted boxes
        xy = rng.uniform(0, 50, (n, 2))
        boxes = np.concatenate(
            [xy, xy + rng.uniform(-10, 10, (n, 2)) * rng.integers(0, 2, (n, 2))], 1
        )
    scores = rng.integers(0, 5, n) / 4.0 if draw(st.booleans()) else rng.random(n)
    cls = rng.integers(0, 3, n) if draw(st.booleans()) else None
    return boxes.astype(np.float32).reshape(n, 4), scores.astype(np.float32), cls


@FUZZ
@given(
    boxes=box_sets(),
    iou=st.floats(-0.1, 1.1),
    score_threshold=st.floats(-0.5, 1.0),
    max_det=st.integers(0, 70),
)
def test_nms_matches_reference(boxes, iou, score_threshold, max_det):
    b, s, cls = boxes
    want = reference.nms(b, s, iou, score_threshold, cls, max_det)
    got = native.nms(b, s, iou, score_threshold, cls, max_det)
    np.testing.assert_array_equal(got, want)
    assert len(got) <= max_det and len(set(got.tolist())) == len(got)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    n=st.integers(0, 25),
    k=st.sampled_from([1, 5, 17]),
    seed=st.integers(0, 2**32 - 1),
    thr=st.floats(0, 1),
    use_boxes=st.booleans(),
)
def test_keypoint_nms_matches_reference(n, k, seed, thr, use_boxes):
    rng = np.random.default_rng(seed)
    kp = rng.uniform(0, 60, (n, k, 3)).astype(np.float32)
    kp[:, :, 2] = rng.integers(0, 2, (n, k))
    scores = rng.random(n).astype(np.float32)
    boxes = None
    if use_boxes:
        xy = rng.uniform(0, 50, (n, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(0, 50, (n, 2))], 1).astype(np.float32)
    np.testing.assert_array_equal(
        native.keypoint_nms(kp, scores, thr, boxes=boxes),
        reference.keypoint_nms(kp, scores, thr, boxes=boxes),
    )


JUNK_DTYPES = st.sampled_from([np.uint8, np.int8, np.float32, np.float64, np.uint16, np.bool_])


@settings(max_examples=800, deadline=None, derandomize=True)
@given(
    shape=st.lists(st.integers(0, 9), min_size=0, max_size=4),
    dtype=JUNK_DTYPES,
    fmt=st.sampled_from(["nv12", "i420", "bgr", "rgb"]),
    size=st.tuples(st.integers(-2, 9), st.integers(-2, 9)),
    strided=st.booleans(),
)
def test_junk_frames_never_crash(shape, dtype, fmt, size, strided):
    arr = np.zeros(shape, dtype)
    if strided and arr.ndim:
        arr = arr[..., ::2]
    fn = getattr(kernels, f"{fmt}_to_tensor")
    try:
        tensor, _ = fn(arr, size)
    except InvalidInput:
        return
    assert tensor.shape == (1, 3, *size)


@settings(max_examples=800, deadline=None, derandomize=True)
@given(
    n=st.integers(0, 6),
    cols=st.integers(0, 5),
    dtype=st.sampled_from([np.float32, np.float64, np.int32]),
    score_len=st.integers(0, 6),
    special=st.sampled_from([0.0, np.nan, np.inf, -np.inf]),
    iou=st.sampled_from([0.5, np.nan, -1.0, 2.0]),
    max_det=st.sampled_from([0, 1, 300, -1]),
)
def test_junk_boxes_never_crash(n, cols, dtype, score_len, special, iou, max_det):
    boxes = np.full((n, cols), 1.0, dtype)
    scores = np.full(score_len, 0.5, np.float32)
    if score_len:
        scores[0] = special
    try:
        keep = kernels.nms(boxes, scores, iou, max_det=max_det)
    except InvalidInput:
        return
    assert keep.dtype == np.int64 and len(keep) <= min(n, max_det)
