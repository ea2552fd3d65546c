"""quads_to_tensor: OCR line crops (rectify + resize + colour + normalise) in one pass.

The reference (numpy, float64) defines correct; the native kernel samples by the same plan
with float32 weights: within TOL on the [0, 1] scale (0.01 of a level; measured ~1e-4).
"""

from __future__ import annotations

import numpy as np
import pytest

import edgefleet.shared.kernels as kernels
from edgefleet.shared.errors import InvalidInput
from edgefleet.shared.kernels import _native, lines, native, reference

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
TOL = 0.01 / 255
FORMATS = ["nv12", "i420", "bgr", "rgb"]


def frame(fmt: str, h: int, w: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if fmt in ("nv12", "i420"):
        return rng.integers(0, 256, (h * 3 // 2, w), dtype=np.uint8)
    return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)


def text_quads(n: int, h: int, w: int, seed: int) -> np.ndarray:
    """Rotated rectangles of every shape: long, tall (read turned), big (supersampled),
    tiny, and some reaching outside the frame (border replicated)."""
    rng = np.random.default_rng(seed)
    centre = rng.uniform(-0.1, 1.1, (n, 2)) * (w, h)
    length = rng.uniform(3, max(4, w), n)
    thick = rng.uniform(2, max(3, h / 2), n)
    angle = rng.uniform(-np.pi, np.pi, n)
    u = np.stack([np.cos(angle), np.sin(angle)], 1) * length[:, None] / 2
    v = np.stack([-np.sin(angle), np.cos(angle)], 1) * thick[:, None] / 2
    quads = np.stack([centre - u - v, centre + u - v, centre + u + v, centre - u + v], 1)
    return quads.astype(np.float32)


def unit_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs((a - b) * np.float32(STD)[None, :, None, None]).max())


def widths_for(quads: np.ndarray, h: int, cap: int) -> np.ndarray:
    sizes, ok = kernels.line_sizes(quads)
    assert ok.all()
    return np.minimum(cap, np.maximum(1, np.ceil(h * sizes[:, 0] / sizes[:, 1]))).astype(np.int32)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("h", "w"), [(360, 640), (1080, 1920), (2, 2), (6, 4)])
def test_native_matches_reference(fmt, h, w):
    # given a random frame, quads of every kind and a batch with two spare slots
    f = frame(fmt, h, w, seed=h + w)
    quads = text_quads(9, h, w, seed=h * w)
    widths = widths_for(quads, 48, 400)
    slots = np.random.default_rng(3).permutation(11)[:9].astype(np.int32)
    got = np.full((11, 3, 48, 400), 7.0, np.float32)
    want = got.copy()
    # when both backends sample them (planes out in B, G, R order)
    native.quads_to_tensor(f, fmt, quads, widths, slots, got, MEAN, STD, -1.5, "bgr")
    reference.quads_to_tensor(f, fmt, quads, widths, slots, want, MEAN, STD, -1.5, "bgr")
    # then they agree, the fill is right of each line and the spare slots are untouched
    assert unit_diff(got[:, ::-1], want[:, ::-1]) <= TOL
    for slot, width in zip(slots, widths, strict=True):
        assert (got[slot, :, :, width:] == -1.5).all()
    spare = sorted(set(range(11)) - set(slots.tolist()))
    assert (got[spare] == 7.0).all()
    assert lines.plan(quads, widths, 48)[1].max() > 1 or h < 100  # big frames supersample


def test_a_pixel_aligned_quad_reads_the_pixels_themselves():
    # given a quad around pixels [10, 30) x [5, 17) (pixel centres on integers)
    f = frame("rgb", 40, 50, seed=1)
    quad = np.array([[[9.5, 4.5], [29.5, 4.5], [29.5, 16.5], [9.5, 16.5]]], np.float32)
    out = np.empty((1, 3, 12, 20), np.float32)
    # when it is read at its own size with mean 0 and std 1
    kernels.quads_to_tensor(f, "rgb", quad, np.array([20]), np.array([0]), out)
    # then each output pixel is that source pixel, / 255
    np.testing.assert_allclose(out[0].transpose(1, 2, 0), f[5:17, 10:30] / 255.0, atol=1e-6)


def test_a_vertical_line_is_read_turned_like_the_crop_was():
    f = frame("bgr", 40, 30, seed=2)
    # a 6 x 20 column of pixels [4, 10) x [8, 28): 3.3x taller than wide
    quad = np.array([[[3.5, 7.5], [9.5, 7.5], [9.5, 27.5], [3.5, 27.5]]], np.float32)
    (length, thick), _ = kernels.line_sizes(quad)[0][0], None
    assert (length, thick) == (20, 6)
    out = np.empty((1, 3, 6, 20), np.float32)
    kernels.quads_to_tensor(f, "bgr", quad, np.array([20]), np.array([0]), out, channels="bgr")
    turned = np.rot90(f[8:28, 4:10])  # what np.rot90 of the old crop gave
    np.testing.assert_allclose(out[0].transpose(1, 2, 0), turned / 255.0, atol=1e-6)


def test_big_text_is_area_averaged_not_aliased():
    # given 1-pixel black and white stripes across a 64 x 400 line read 8x smaller
    f = np.zeros((64, 400, 3), np.uint8)
    f[:, 1::2] = 255
    quad = np.array([[[-0.5, -0.5], [399.5, -0.5], [399.5, 63.5], [-0.5, 63.5]]], np.float32)
    out = np.empty((1, 3, 8, 50), np.float32)
    kernels.quads_to_tensor(f, "rgb", quad, np.array([50]), np.array([0]), out)
    # then every output pixel is their mean (one bilinear tap per pixel would read a
    # stripe: 0 or 1 depending on where it lands)
    assert np.abs(out - 0.5).max() < 0.02


def test_threads_agree_and_bad_lengths_are_refused_by_the_extension():
    f = frame("nv12", 720, 1280, seed=4)
    quads = text_quads(30, 720, 1280, seed=5)
    widths = widths_for(quads, 48, 800)
    hom, taps, _ = lines.plan(quads, widths, 48)
    assert int((widths * 48 * taps.prod(axis=1)).sum()) > 1 << 20  # enough work to split
    slots = np.arange(30, dtype=np.int32)
    one = np.empty((30, 3, 48, 800), np.float32)
    two = np.empty_like(one)
    native.quads_to_tensor(f, "nv12", quads, widths, slots, one, threads=1)
    native.quads_to_tensor(f, "nv12", quads, widths, slots, two, threads=2)
    np.testing.assert_array_equal(one, two)
    args = [f, 0, 720, 1280, hom, taps, widths, slots, one, 48, 800, (1,) * 3, (0,) * 3, 0.0, 1]
    with pytest.raises(ValueError, match="lengths differ"):
        _native.quads_to_tensor(*args[:4], hom[:-1], *args[5:])
    with pytest.raises(ValueError, match="out of range"):
        bad = slots.copy()
        bad[0] = 30
        _native.quads_to_tensor(*args[:7], bad, *args[8:])
    with pytest.raises(ValueError, match="wrong length"):
        _native.quads_to_tensor(f[:-3], *args[1:])


QUAD = np.array([[[1, 1], [20, 1], [20, 8], [1, 8]]], np.float32)
NAN = QUAD.copy()
NAN[0, 2, 0] = np.nan
FLAT = np.array([[[1, 1], [10, 1], [20, 1], [5, 1]]], np.float32)
BOWTIE = np.array([[[0, 0], [10, 10], [10, 0], [0, 10]]], np.float32)
OUT = np.zeros((2, 3, 8, 32), np.float32)


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"fmt": "yuyv"}, "unknown frame format"),
        ({"frame": np.zeros((48, 64), np.uint8)}, "packed rgb"),
        ({"quads": NAN}, "finite"),
        ({"quads": QUAD * 1e7}, "finite"),
        ({"quads": QUAD.astype(np.float64)}, "float32"),
        ({"quads": QUAD[0]}, r"\(N, 4, 2\)"),
        ({"quads": FLAT}, "not convex"),
        ({"quads": BOWTIE}, "not convex"),
        ({"widths": np.array([0])}, "widths must lie"),
        ({"widths": np.array([33])}, "widths must lie"),
        ({"widths": np.array([1.5])}, "widths must hold one integer per quad"),
        ({"slots": np.array([2])}, "slots must lie"),
        ({"slots": np.array([0, 1])}, "slots must hold one integer per quad"),
        ({"out": OUT.astype(np.float16)}, "float32"),
        ({"out": OUT[:, :2]}, r"\(B, 3, h, W\)"),
        ({"out": OUT[:, :, :, ::2]}, "C-contiguous"),
        ({"std": (1, 0, 1)}, "non-zero"),
        ({"fill": float("nan")}, "finite"),
        ({"channels": "yuv"}, "channels"),
    ],
)
@pytest.mark.parametrize("backend", ["native", "reference"])
def test_bad_input_is_a_typed_error(kwargs, why, backend):
    args = {
        "frame": frame("rgb", 16, 32),
        "fmt": "rgb",
        "quads": QUAD,
        "widths": np.array([20]),
        "slots": np.array([1]),
        "out": OUT.copy(),
        "std": (1.0, 1.0, 1.0),
        "fill": 0.0,
        "channels": "rgb",
    } | kwargs
    kernels.use_backend(backend)
    try:
        with pytest.raises(InvalidInput, match=why):
            kernels.quads_to_tensor(**args)
    finally:
        kernels.use_backend(None)


def test_duplicate_slots_and_read_only_out_are_refused():
    f = frame("rgb", 16, 32)
    two = np.concatenate([QUAD, QUAD])
    with pytest.raises(InvalidInput, match="distinct"):
        kernels.quads_to_tensor(f, "rgb", two, np.array([5, 5]), np.array([1, 1]), OUT.copy())
    frozen = OUT.copy()
    frozen.flags.writeable = False
    with pytest.raises(InvalidInput, match="read-only"):
        kernels.quads_to_tensor(f, "rgb", QUAD, np.array([5]), np.array([0]), frozen)


def test_no_quads_is_no_work_and_line_sizes_say_what_cannot_be_read():
    out = OUT.copy()
    none = np.empty((0, 4, 2), np.float32)
    kernels.quads_to_tensor(frame("nv12", 16, 32), "nv12", none, [], [], out)
    assert (out == 0).all()
    sizes, ok = kernels.line_sizes(np.concatenate([QUAD, FLAT, BOWTIE]))
    assert sizes[0].tolist() == [19, 7] and ok.tolist() == [True, False, False]
    with pytest.raises(InvalidInput, match="NaN"):
        kernels.line_sizes(NAN)
    for bad in (QUAD[0], [["a"]], np.zeros((2, 3, 2), np.float32)):
        with pytest.raises(InvalidInput, match="quads must"):
            kernels.line_sizes(bad)
