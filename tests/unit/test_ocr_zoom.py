"""The OCR pipeline's zoomed pass: where it looks, what it keeps, and lines it saves."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from edgefleet.demo.scenes.clips import frame_scores, render_clip
from edgefleet.shared import kernels
from edgefleet.shared.imaging.letterbox import LetterboxTransform
from edgefleet.shared.models import ocr
from edgefleet.shared.models.ocr import merge_boxes, readable, surer, zoom_regions
from tests.support.frames import as_format

PLAN = LetterboxTransform.stretch((360, 640), (352, 640))  # a 640x360 frame's first pass


def quad(x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float32)


def test_zoom_regions_surround_faint_text_and_skip_specks():
    # given a first-pass map with a faint line (far under the binarisation threshold),
    # a strong line and a two-pixel speck
    prob = np.zeros((352, 640), np.float32)
    prob[100:110, 200:300] = 0.01
    prob[250:262, 50:150] = 0.9
    prob[20, 600:602] = 0.5
    # when the regions to zoom are found
    boxes = zoom_regions(prob, PLAN, 0.005)
    # then each line has one, grown by its height plus 8 px (12 along), in source pixels
    # on the merge's 4 px grid
    assert len(boxes) == 2
    faint = boxes[np.argmin(np.abs(boxes[:, 1] - 100))]
    height = 10 * 360 / 352
    assert faint[0] == pytest.approx(200 - height - 12, abs=4)
    assert faint[2] == pytest.approx(300 + height + 12, abs=4)
    assert faint[1] == pytest.approx(100 * 360 / 352 - height - 8, abs=4)
    # and nothing stirring means nothing to zoom
    assert zoom_regions(np.zeros((352, 640), np.float32), PLAN, 0.005).shape == (0, 4)


def test_merge_boxes_joins_chains_and_keeps_the_rest_apart():
    boxes = np.array(
        [[0, 0, 10, 10], [8, 8, 20, 20], [18, 0, 30, 9], [50, 50, 60, 55]], np.float32
    )  # the first three touch in a chain
    merged = merge_boxes(boxes, (100, 100), cell=1)
    assert merged.tolist() == [[0, 0, 30, 20], [50, 50, 60, 55]]  # largest first
    # on the default 4 px grid the same boxes, rounded out to the grid
    assert merge_boxes(boxes, (100, 100)).tolist() == [[0, 0, 32, 20], [48, 48, 60, 56]]


def test_merge_boxes_leaves_no_two_boxes_touching_whatever_the_count():
    rng = np.random.default_rng(7)
    corners = rng.uniform(0, 1000, (5000, 2))
    boxes = np.concatenate([corners, corners + rng.uniform(1, 15, (5000, 2))], 1)
    merged = merge_boxes(boxes.astype(np.float32), (1024, 1024))
    lo, hi = merged[:, None, :2], merged[:, None, 2:]
    touch = np.all((lo <= merged[None, :, 2:]) & (merged[None, :, :2] <= hi), axis=2)
    assert touch.sum() == len(merged)  # each box touches only itself


def test_a_surer_zoomed_line_replaces_the_pieces_it_covers():
    # given a line the first pass split in two and read unsurely, and a line elsewhere
    first = np.stack([quad(10, 10, 40, 30), quad(42, 10, 70, 30), quad(10, 100, 90, 120)])
    reads = [("STO", 0.7, 0.7), ("P", 0.8, 0.8), ("EXIT", 0.95, 0.95)]
    # when the zoom reads the first line whole and more surely, and finds a new one
    zoomed = np.stack([quad(9, 9, 71, 31), quad(200, 50, 260, 70)])
    rezoomed = [("STOP", 0.97, 0.97), ("GATE 7", 0.9, 0.9)]
    quads, lines = surer(first, reads, zoomed, rezoomed)
    # then the whole line replaces both pieces, the new line is added, the rest is kept
    assert [text for text, _, _ in lines] == ["EXIT", "STOP", "GATE 7"]
    assert quads.shape == (3, 4, 2)
    # and a zoomed read less sure than what it overlaps is dropped
    quads, lines = surer(first, reads, zoomed[:1], [("ST0P", 0.75, 0.75)])
    assert [text for text, _, _ in lines] == ["STO", "P", "EXIT"]


def test_readable_keeps_lines_inside_the_image_and_big_enough():
    kept = readable([quad(-5, 10, 50, 30), quad(100, 100, 102, 130)], PLAN)
    assert kept.shape == (1, 4, 2) and kept[:, :, 0].min() == 0  # clipped; the sliver dropped


@pytest.mark.parametrize(
    "seed,index,text",
    [(1006, 15, "STOP"), (1001, 5, "EGLU7436450")],
    ids=["a sign read in part", "a container code read in pieces"],
)
def test_the_zoom_reads_faint_lines_the_first_pass_loses(tiny, monkeypatch, seed, index, text):
    # given a hard frame (640x360, faint, blurred, heavy JPEG) of the benchmark's clips
    clip = render_clip(seed, frames=index + 1)
    frame = cv2.imdecode(np.frombuffer(clip.jpegs[index], np.uint8), cv2.IMREAD_COLOR)
    truth = [line for line in clip.truth[index] if line.text == text]
    # O and 0 as the recogniser reads them (the first pass's `ST0` is `STO` settled): the
    # zoom's own effect
    reading = tiny.lines.opts.model_copy(update={"word_kinds": None})
    monkeypatch.setattr(tiny.lines, "opts", reading)

    def score(model) -> tuple[float, bool]:
        reads = [(d.text or "", d.box) for d in model.predict_many([frame], fmt="bgr")[0]]
        return frame_scores(reads, truth)[0]

    # when it is read with the zoom (on by default at the edge) and without it
    assert tiny.opts.det_zoom == 2.0
    zoomed = score(tiny)
    monkeypatch.setattr(tiny, "opts", tiny.opts.model_copy(update={"det_zoom": None}))
    first = score(tiny)
    # then the zoom reads the line exactly, where the first pass read half of it at most
    assert zoomed == (1.0, True)
    assert first[0] <= 0.5


@pytest.mark.parametrize("fmt", ["nv12", "i420"])
def test_the_zoom_cuts_yuv_frames_in_their_own_format(tiny, monkeypatch, fmt):
    # given the hard frame whose container code the first pass reads in pieces, as a
    # camera's YUV frame
    clip = render_clip(1001, frames=6)
    bgr = cv2.imdecode(np.frombuffer(clip.jpegs[5], np.uint8), cv2.IMREAD_COLOR)
    frame = as_format(np.ascontiguousarray(bgr[..., ::-1]), fmt)
    handed: list[np.ndarray] = []
    real = kernels.frame_to_tensor

    def to_tensor(pixels, f, *args, **kwargs):
        assert f == fmt  # never converted on the way
        handed.append(pixels)
        return real(pixels, f, *args, **kwargs)

    monkeypatch.setattr(kernels, "frame_to_tensor", to_tensor)
    truth = [line for line in clip.truth[5] if line.text == "EGLU7436450"]

    def score() -> float:
        lines = tiny.predict_many([frame], fmt=fmt)[0]
        return frame_scores([(d.text or "", d.box) for d in lines], truth)[0][0]

    # when it is read, with the zoom and without it
    zoomed, regions = score(), handed[1:]
    monkeypatch.setattr(tiny, "opts", tiny.opts.model_copy(update={"det_zoom": None}))
    first = score()
    # then the zoomed regions were cut from it as small frames of the same format, and
    # the zoom reads the code nearly whole where the first pass read it in pieces
    assert handed[0] is frame and regions and all(r.size <= frame.size // 4 for r in regions)
    assert zoomed >= 0.9 and first <= 0.5, (zoomed, first)


def test_the_zoomed_calls_per_frame_are_capped(tiny, monkeypatch):
    # given a frame of many faint, blurred words (each a region the zoom would look at)
    frame = np.full((360, 640, 3), 128, np.uint8)
    for row in range(6):
        for col in range(4):
            at = (20 + col * 160, 40 + row * 58)
            cv2.putText(frame, f"K{row}{col}", at, cv2.FONT_HERSHEY_SIMPLEX, 0.5, (150,) * 3, 1)
    frame = cv2.GaussianBlur(frame, (0, 0), 1.5)
    calls: list[tuple[int, ...]] = []
    real = tiny.det.run

    def counted(tensor):
        calls.append(tensor.shape)
        return real(tensor)

    monkeypatch.setattr(tiny.det, "run", counted)
    tiny.predict_many([frame], fmt="bgr")
    uncapped = len(calls) - 1
    assert uncapped > 2  # the zoom looks at several regions of it
    # when the cap is lower than that
    monkeypatch.setattr(ocr, "ZOOM_MAX", 2)
    calls.clear()
    tiny.predict_many([frame], fmt="bgr")
    # then the first pass and 2 zoomed calls run, no more: whatever a frame holds, it
    # costs at most ZOOM_MAX (8) detector calls more than the first pass
    assert len(calls) == 1 + 2


def test_a_frame_reads_the_same_whatever_it_is_batched_with(tiny):
    # given frames of three sizes (the tiles of a track differ by a few pixels)
    clip = render_clip(1001, frames=6)
    frame = cv2.imdecode(np.frombuffer(clip.jpegs[5], np.uint8), cv2.IMREAD_COLOR)
    frames = [frame, np.ascontiguousarray(frame[:, :600]), np.ascontiguousarray(frame[20:, 30:])]
    # and a frame of one long line (a recogniser batch as wide as the longest line in it
    # would pad every short line to its width)
    long = np.full((360, 640, 3), 230, np.uint8)
    cv2.putText(
        long,
        "SLOW DOWN - TRUCKS TURNING 200 M",
        (12, 180),
        cv2.FONT_HERSHEY_SIMPLEX,
        0.9,
        (20, 20, 20),
        2,
    )
    frames.append(long)
    # when they are read in one batch and one by one
    together = tiny.predict_many(frames, fmt="bgr")
    alone = [tiny.predict_many([f], fmt="bgr")[0] for f in frames]

    def reads(frame_lines):
        return [[(d.text, d.box, round(d.score, 4)) for d in lines] for lines in frame_lines]

    # then every frame reads the same, to the score (no frame is padded to another's
    # canvas, no line to another's width)
    assert reads(together) == reads(alone)
    assert "EGLU7436450" in [d.text for d in together[0]]
