"""Native kernels against the numpy/OpenCV reference, and their handling of bad input.

Tolerances: pre-processing within 1/255 per channel on the [0, 1] scale (before
mean/std); NMS must keep the identical indices in the identical order.
"""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import REGISTRY

import edgefleet.shared.kernels as kernels
from edgefleet.shared.errors import InvalidInput
from edgefleet.shared.imaging.letterbox import LetterboxTransform
from edgefleet.shared.kernels import _native, native, reference

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
TOL = 1.0 / 255.0


def frame(fmt: str, h: int, w: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if fmt in ("nv12", "i420"):
        return rng.integers(0, 256, (h * 3 // 2, w), dtype=np.uint8)
    return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)


def unit_scale_diff(a: np.ndarray, b: np.ndarray, std=STD) -> float:
    """Largest difference on the [0, 1] scale, i.e. undoing the division by std."""
    s = np.asarray(std, np.float32)[None, :, None, None]
    return float(np.abs((a.astype(np.float32) - b.astype(np.float32)) * s).max())


CASES = [
    ("nv12", 1080, 1920, (640, 640)),
    ("nv12", 2, 2, (5, 7)),
    ("nv12", 2, 1000, (64, 64)),
    ("nv12", 1000, 2, (64, 64)),
    ("nv12", 36, 100, (640, 384)),
    ("i420", 720, 1280, (384, 640)),
    ("i420", 4, 6, (4, 6)),
    ("bgr", 1, 1, (8, 8)),
    ("bgr", 3, 5, (33, 17)),
    ("bgr", 999, 3, (320, 320)),
    ("rgb", 7, 1, (16, 16)),
    ("rgb", 481, 641, (640, 640)),
]


@pytest.mark.parametrize(("fmt", "h", "w", "size"), CASES)
@pytest.mark.parametrize("impl", [native.IMPL_AUTO, native.IMPL_PORTABLE])
def test_native_matches_reference(fmt, h, w, size, impl):
    # Given a random frame, when both backends convert it,
    f = frame(fmt, h, w)
    got, t = native.frame_to_tensor(f, fmt, size, MEAN, STD, 114, impl=impl)
    want, t_ref = reference.frame_to_tensor(f, fmt, size, MEAN, STD, 114)
    # then geometry is the planned letterbox and values agree within one level.
    assert t == t_ref == LetterboxTransform.plan((h, w), size)
    assert got.shape == (1, 3, *size) and got.dtype == np.float32
    assert unit_scale_diff(got, want) <= TOL


@pytest.mark.parametrize(("fmt", "h", "w", "size"), [c for c in CASES if c[1] > 2])
def test_stretch_fills_the_canvas_and_matches_reference(fmt, h, w, size):
    # Given a random frame, when both backends stretch it onto a canvas of another aspect,
    f = frame(fmt, h, w, seed=7)
    got, t = native.frame_to_tensor(f, fmt, size, MEAN, STD, 114, stretch=True)
    want, t_ref = reference.frame_to_tensor(f, fmt, size, MEAN, STD, 114, stretch=True)
    # then each axis is scaled on its own, nothing is padded, and values agree.
    assert t == t_ref == LetterboxTransform(h, w, *size, *size, 0, 0)
    assert got.shape == (1, 3, *size)
    assert unit_scale_diff(got, want) <= TOL


@pytest.mark.parametrize("fmt", ["nv12", "bgr"])
def test_float16_output_and_out_buffer(fmt):
    f = frame(fmt, 120, 160, seed=3)
    out = np.full((1, 3, 96, 128), np.nan, np.float16)
    got, _ = native.frame_to_tensor(f, fmt, (96, 128), MEAN, STD, 0, np.float16, out)
    want, _ = reference.frame_to_tensor(f, fmt, (96, 128), MEAN, STD, 0, np.float16)
    assert got is out and not np.isnan(out).any()
    # float16 adds its own rounding (~1e-3 relative at |x| ~ 2): one level plus that.
    assert unit_scale_diff(got, want) <= TOL + 2e-3


def test_padding_value_and_threads_agree():
    f = frame("nv12", 360, 640, seed=5)
    one, t = native.frame_to_tensor(f, "nv12", (640, 640), pad=0, threads=1)
    two, _ = native.frame_to_tensor(f, "nv12", (640, 640), pad=0, threads=2)
    np.testing.assert_array_equal(one, two)
    assert (one[:, :, : t.pad_top] == 0).all() and (one[:, :, t.pad_top + t.new_h :] == 0).all()


def test_public_entry_points_use_the_active_backend():
    assert kernels.backend() in ("neon", "c")
    f = frame("nv12", 64, 96)
    tensor, t = kernels.nv12_to_tensor(f, (32, 32))
    want, _ = reference.frame_to_tensor(f, "nv12", (32, 32))
    assert unit_scale_diff(tensor, want, (1, 1, 1)) <= TOL and t.new_w == 32
    for fn, fmt in [
        (kernels.i420_to_tensor, "i420"),
        (kernels.bgr_to_tensor, "bgr"),
        (kernels.rgb_to_tensor, "rgb"),
    ]:
        f = frame(fmt, 50, 70)
        got, _ = fn(f, (40, 40), MEAN, STD)
        assert (
            unit_scale_diff(got, reference.frame_to_tensor(f, fmt, (40, 40), MEAN, STD)[0]) <= TOL
        )


def test_backend_choice_explains_itself_and_can_be_forced():
    choice = kernels.choose_backend()
    assert choice.name in ("neon", "c")
    assert any(name == "cuda" and why for name, why in choice.rejected)
    try:
        assert kernels.use_backend("reference") == "reference"
        gauge = "ef_kernels_backend"
        assert REGISTRY.get_sample_value(gauge, {"backend": "reference"}) == 1
        assert REGISTRY.get_sample_value(gauge, {"backend": choice.name}) == 0
        idx = kernels.nms(np.zeros((1, 4), np.float32), np.ones(1, np.float32), 0.5)
        assert idx.tolist() == [0]
    finally:
        kernels.use_backend(None)
    with pytest.raises(InvalidInput):
        kernels.use_backend("tpu")


# --- NMS -------------------------------------------------------------------------------


def random_boxes(n: int, seed: int, spread: float = 1000.0):
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, spread, (n, 2)).astype(np.float32)
    wh = rng.uniform(1, spread / 8, (n, 2)).astype(np.float32)
    boxes = np.concatenate([xy, xy + wh], axis=1).astype(np.float32)
    scores = rng.random(n, dtype=np.float32)
    return boxes, scores, rng.integers(0, 5, n).astype(np.int64)


@pytest.mark.parametrize("n", [0, 1, 2, 17, 300, 2000])
@pytest.mark.parametrize("iou", [0.0, 0.3, 0.5, 0.9])
def test_nms_matches_reference(n, iou):
    boxes, scores, cls = random_boxes(n, seed=n)
    for kwargs in ({}, {"class_ids": cls}, {"score_threshold": 0.4, "max_det": 50}):
        want = reference.nms(boxes, scores, iou, **kwargs)
        for impl in (native.IMPL_AUTO, native.IMPL_PORTABLE):
            got = native.nms(boxes, scores, iou, impl=impl, **kwargs)
            assert got.dtype == np.int64
            np.testing.assert_array_equal(got, want)


def test_nms_ties_identical_boxes_and_degenerate_boxes():
    # All-identical boxes with equal scores: the lowest index survives.
    boxes = np.tile(np.array([[10, 10, 50, 50]], np.float32), (6, 1))
    scores = np.full(6, 0.7, np.float32)
    assert (
        native.nms(boxes, scores, 0.5).tolist() == [0] == reference.nms(boxes, scores, 0.5).tolist()
    )
    # Different classes never suppress each other; order is score then index.
    cls = np.array([0, 1, 0, 1, 2, 2], np.int32)
    assert native.nms(boxes, scores, 0.5, class_ids=cls).tolist() == [0, 1, 4]
    # Zero-area boxes overlap nothing.
    zero = np.zeros((3, 4), np.float32)
    assert native.nms(zero, scores[:3], 0.5).tolist() == [0, 1, 2]
    # Higher score first regardless of index.
    s = np.array([0.1, 0.9, 0.5], np.float32)
    assert native.nms(zero, s, 0.5).tolist() == [1, 2, 0]


def test_keypoint_nms_matches_reference():
    rng = np.random.default_rng(7)
    base = rng.uniform(0, 200, (40, 17, 3)).astype(np.float32)
    base[:, :, 2] = rng.random((40, 17)) > 0.3
    # Half the poses are jittered copies of the others, so some must be suppressed.
    kp = np.concatenate([base, base + rng.normal(0, 2, base.shape).astype(np.float32)])
    kp[:, :, 2] = np.concatenate([base[:, :, 2], base[:, :, 2]])
    kp = np.ascontiguousarray(kp, np.float32)
    scores = rng.random(80, dtype=np.float32)
    for thr in (0.3, 0.5, 0.8):
        want = reference.keypoint_nms(kp, scores, thr)
        np.testing.assert_array_equal(native.keypoint_nms(kp, scores, thr), want)
        assert 40 <= len(want) < 80
    boxes = np.concatenate([kp[:, :, :2].min(1), kp[:, :, :2].max(1)], 1).astype(np.float32)
    np.testing.assert_array_equal(
        native.keypoint_nms(kp, scores, 0.5, boxes=boxes, max_det=10),
        reference.keypoint_nms(kp, scores, 0.5, boxes=boxes, max_det=10),
    )
    assert kernels.keypoint_nms(kp[:0], scores[:0]).tolist() == []


# --- bad input -------------------------------------------------------------------------

NV12 = frame("nv12", 8, 8)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((NV12[:-1], (4, 4)), {}),  # wrong buffer length (rows not H*3/2)
        ((NV12[:, :7].copy(), (4, 4)), {}),  # odd width for 4:2:0
        ((NV12[:, ::2], (4, 4)), {}),  # non-contiguous
        ((NV12.astype(np.float32), (4, 4)), {}),  # wrong dtype
        ((NV12.tolist(), (4, 4)), {}),  # not an array
        ((NV12, (0, 640)), {}),  # zero-size output
        ((NV12, (4,)), {}),
        ((NV12, (4, 4)), {"std": (1, 0, 1)}),
        ((NV12, (4, 4)), {"mean": (0, float("nan"), 0)}),
        ((NV12, (4, 4)), {"pad": 300}),
        ((NV12, (4, 4)), {"dtype": np.int8}),
        ((NV12, (4, 4)), {"out": np.empty((1, 3, 4, 5), np.float32)}),
        ((NV12, (4, 4)), {"out": np.empty((1, 3, 4, 4), np.float16)}),
        ((NV12, (4, 4)), {"out": np.empty((1, 3, 4, 8), np.float32)[..., ::2]}),
    ],
)
def test_bad_frames_are_typed_errors(args, kwargs):
    with pytest.raises(InvalidInput):
        kernels.nv12_to_tensor(*args, **kwargs)
    with pytest.raises(InvalidInput):
        reference.frame_to_tensor(args[0], "nv12", *args[1:], **kwargs)


def test_bad_nms_inputs_are_typed_errors():
    boxes, scores, cls = random_boxes(10, seed=1)
    nan_scores = scores.copy()
    nan_scores[3] = np.nan
    nan_boxes = boxes.copy()
    nan_boxes[2, 1] = np.nan
    bad = [
        (boxes, nan_scores, 0.5, {}),
        (nan_boxes, scores, 0.5, {}),
        (boxes.astype(np.float64), scores, 0.5, {}),
        (boxes, scores.astype(np.float64), 0.5, {}),
        (boxes[:, :3].copy(), scores, 0.5, {}),
        (boxes[::2], scores[::2], 0.5, {}),
        (boxes, scores[:9], 0.5, {}),
        (boxes, scores, float("nan"), {}),
        (boxes, scores, 0.5, {"class_ids": cls.astype(np.float32)}),
        (boxes, scores, 0.5, {"class_ids": cls[:5]}),
        (boxes, scores, 0.5, {"max_det": -1}),
    ]
    for b, s, iou, kw in bad:
        with pytest.raises(InvalidInput):
            kernels.nms(b, s, iou, **kw)
    kp = np.zeros((2, 17, 3), np.float32)
    with pytest.raises(InvalidInput):
        kernels.keypoint_nms(kp, np.array([0.5, np.nan], np.float32))
    with pytest.raises(InvalidInput):
        kernels.keypoint_nms(kp[:, :, :2].copy(), np.ones(2, np.float32))


def test_extension_checks_lengths_itself():
    # Called directly (bypassing the Python checks) it raises ValueError, never crashes.
    out = np.empty((1, 3, 4, 4), np.float32)
    args = [0, 8, 8, 4, 4, 4, 4, 0, 0, [1, 1, 1], [0, 0, 0], [0, 0, 0], out, 0, 0, 1]
    with pytest.raises(ValueError):
        _native.preprocess(NV12[:-3], *args)
    with pytest.raises(ValueError):
        _native.preprocess(NV12, *args[:12], np.empty(5, np.float32), *args[13:])
    with pytest.raises(ValueError):
        _native.preprocess(NV12, 0, 8, 8, 4, 4, 5, 4, 0, 0, *args[9:])  # image taller than canvas
    keep = np.empty(1, np.int64)
    with pytest.raises(ValueError):
        _native.nms(np.zeros(8, np.float32), np.zeros(3, np.float32), None, 0.5, 0.0, 3, keep, 0)


@pytest.mark.parametrize(
    ("h", "w", "size"), [(1080, 1920, (640, 640)), (2, 2, (3, 9)), (98, 36, (64, 96))]
)
def test_both_references_agree_and_native_matches_imaging_reference(h, w, size):
    # edgefleet.shared.imaging.tensor.preprocess_reference is the project-wide definition; ours
    # (the 'reference' backend) must equal it, and the native kernel stays within one level.
    from edgefleet.shared.imaging.tensor import preprocess_reference

    f = frame("nv12", h, w, seed=11)
    want, t_img = preprocess_reference(f, size, MEAN, STD, 114)
    ours, t_ref = reference.frame_to_tensor(f, "nv12", size, MEAN, STD, 114)
    np.testing.assert_allclose(ours, want, rtol=0, atol=1e-6)
    got, t = kernels.nv12_to_tensor(f, size, MEAN, STD, 114)
    assert t == t_ref == t_img
    assert unit_scale_diff(got, want) <= TOL


def test_concurrent_calls_from_python_threads_agree():
    # The GIL is released inside the kernels: calls from several threads run at once
    # and must not share state (each call owns its tables and row buffers).
    from concurrent.futures import ThreadPoolExecutor

    frames = [frame("nv12", 240, 320, seed=s) for s in range(8)]
    boxes, scores, _ = random_boxes(500, seed=2)
    expected = [native.frame_to_tensor(f, "nv12", (160, 160), MEAN, STD)[0] for f in frames]
    expected_keep = native.nms(boxes, scores, 0.5, max_det=500)

    def work(i: int):
        t, _ = native.frame_to_tensor(frames[i % 8], "nv12", (160, 160), MEAN, STD, threads=2)
        return i, t, native.nms(boxes, scores, 0.5, max_det=500)

    with ThreadPoolExecutor(4) as pool:
        for i, tensor, keep in pool.map(work, range(32)):
            np.testing.assert_array_equal(tensor, expected[i % 8])
            np.testing.assert_array_equal(keep, expected_keep)


def guarded(nbytes: int):
    """A uint8 array whose last byte is followed by an inaccessible page (Linux)."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    total = -(-nbytes // page) * page + page
    buf = mmap.mmap(-1, total, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(base + total - page, page, 0) == 0  # PROT_NONE
    arr = np.frombuffer(buf, np.uint8, count=nbytes, offset=total - page - nbytes)
    return arr, buf


@pytest.mark.skipif(
    not hasattr(np, "frombuffer") or __import__("sys").platform != "linux",
    reason="guard pages via mprotect need Linux",
)
@pytest.mark.parametrize(
    ("fmt", "h", "w"),
    [
        ("nv12", 1080, 1920),
        ("i420", 64, 72),
        ("nv12", 2, 8),
        ("i420", 6, 18),
        ("bgr", 5, 9),
        ("rgb", 33, 17),
    ],
)
def test_no_read_past_the_end_of_the_frame(fmt, h, w):
    # SIMD gathers read whole words: a frame that ends right before a guard page would
    # crash the process if any path read past its last byte. Upscale and downscale.
    shape = (h * 3 // 2, w) if fmt in ("nv12", "i420") else (h, w, 3)
    flat, keep_alive = guarded(int(np.prod(shape)))
    flat[:] = np.random.default_rng(h).integers(0, 256, flat.size, dtype=np.uint8)
    f = flat.reshape(shape)
    for size in ((h * 2 + 1, w * 2 + 3), (max(1, h // 3), max(1, w // 3)), (640, 640)):
        got, _ = native.frame_to_tensor(f, fmt, size)
        want, _ = reference.frame_to_tensor(np.array(f), fmt, size)
        assert unit_scale_diff(got, want, (1, 1, 1)) <= TOL
    del f, flat
    keep_alive.close()


@pytest.mark.parametrize("fmt", ["nv12", "i420", "bgr", "rgb"])
def test_crop_resize_matches_reference_per_slot(fmt):
    from edgefleet.shared.kernels import checks
    from edgefleet.shared.kernels.crops import crop_windows

    f = frame(fmt, 120, 200, seed=9)
    boxes = np.array(
        [
            [10.2, 20.7, 90.1, 44.0],  # an OCR-line shape
            [150.0, 0.0, 260.0, 130.0],  # spills past the right and bottom edges
            [5.0, 5.0, 5.0, 5.0],  # empty: becomes the minimal crop
            [-40.0, -40.0, -10.0, -10.0],  # outside: the nearest minimal crop
            [60.0, 90.0, 40.0, 70.0],  # inverted corners
        ],
        np.float32,
    )
    batch, places = kernels.crop_resize(f, boxes, (48, 160), fmt, MEAN, STD)
    assert batch.shape == (5, 3, 48, 160) and len(places) == 5
    rgb = reference.to_rgb(f, fmt)
    norm = checks.normalise(MEAN, STD, 114)
    for i, (x0, y0, x1, y1) in enumerate(crop_windows(boxes, (120, 200), fmt)):
        assert 0 <= x0 < x1 <= 200 and 0 <= y0 < y1 <= 120
        if fmt in ("nv12", "i420"):
            assert x0 % 2 == y0 % 2 == x1 % 2 == y1 % 2 == 0
        want, t = reference.letterbox_normalise(rgb[y0:y1, x0:x1], (48, 160), norm, np.float32)
        assert places[i].transform == t and (places[i].x0, places[i].y0) == (x0, y0)
        assert unit_scale_diff(batch[i : i + 1], want) <= TOL
    # Slot coordinates map back into the frame: the crop's own corners.
    t0 = places[0].transform
    corners = np.array([[t0.pad_left, t0.pad_top, t0.pad_left + t0.new_w, t0.pad_top + t0.new_h]])
    x0, y0, x1, y1 = crop_windows(boxes, (120, 200), fmt)[0]
    assert (x0, y0, x1, y1) == ((10, 20, 92, 44) if fmt in ("nv12", "i420") else (10, 20, 91, 44))
    np.testing.assert_allclose(places[0].boxes_to_frame(corners), [[x0, y0, x1, y1]], atol=1e-3)


def test_crop_resize_bad_input():
    f = frame("bgr", 20, 20)
    for bad in (
        np.zeros((2, 4), np.float64),
        np.zeros((2, 3), np.float32),
        np.array([[0, 0, np.nan, 4]], np.float32),
        [[0, 0, 4, 4]],
    ):
        with pytest.raises(InvalidInput):
            kernels.crop_resize(f, bad, (8, 8), "bgr")
    with pytest.raises(InvalidInput):
        kernels.crop_resize(f, np.zeros((2, 4), np.float32), (8, 8), "bgr", out=np.empty(3))
    empty, places = kernels.crop_resize(f, np.zeros((0, 4), np.float32), (8, 8), "bgr")
    assert empty.shape == (0, 3, 8, 8) and places == []
